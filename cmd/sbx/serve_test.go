package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
)

// TestLLMFlags: the chat loop's endpoint from flags and SBX_LLM_*
// variables; its key never shows.
func TestLLMFlags(t *testing.T) {
	const key = "sk-secret-do-not-show"
	t.Setenv("SBX_LLM_API_KEY", key)
	t.Setenv("SBX_LLM_MAX_STEPS", "5")
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg, err := llmConfig(fs, "http://127.0.0.1:8000/v1", "m1", "", "", 8, 20, 24000)
	if err != nil || cfg.APIKey != key || cfg.MaxSteps != 5 || cfg.Model != "m1" || cfg.BaseURL != "http://127.0.0.1:8000/v1" {
		t.Errorf("from the environment: %+v %v", cfg, err)
	}
	fs.Int("llm-max-steps", 8, "")
	fs.Parse([]string{"--llm-max-steps", "3"})
	if cfg, err := llmConfig(fs, "http://h/v1", "m1", "", "flag-key", 3, 20, 24000); err != nil || cfg.MaxSteps != 3 || cfg.APIKey != "flag-key" {
		t.Errorf("flags over the environment: %+v %v", cfg, err)
	}
	if cfg, err := llmConfig(fs, "", "m1", "", "", 3, 20, 24000); err != nil || cfg.BaseURL != "" {
		t.Errorf("no endpoint: %+v %v", cfg, err)
	}
	for _, bad := range []struct {
		url, model string
		steps      int
	}{
		{"http://h/v1", "", 8}, {"ftp://h/v1", "m", 8}, {"h:8000", "m", 8}, {"http://h/v1", "m", 0}, {"http://h/v1", "m", 1000},
	} {
		if _, err := llmConfig(fs, bad.url, bad.model, "", "", bad.steps, 20, 24000); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// The usage does not show the key as a default.
	var out bytes.Buffer
	serve(context.Background(), []string{"-h"}, &out, &out)
	if strings.Contains(out.String(), key) || !strings.Contains(out.String(), "-llm-base-url") {
		t.Errorf("usage: %s", out.String())
	}
}

// A metrics token that is also an API key would let that key's tenant
// read every tenant's usage: serve refuses it before opening anything.
func TestMetricsTokenFlag(t *testing.T) {
	t.Setenv("SBX_METRICS_TOKEN", "")
	var out bytes.Buffer
	code := serve(context.Background(), []string{"--api-key", "shared-key-1:alpha", "--metrics-token", "shared-key-1"}, &out, &out)
	if code != 2 || !strings.Contains(out.String(), "also an API key") {
		t.Errorf("a metrics token that is an API key: exit %d: %s", code, out.String())
	}
	t.Setenv("SBX_METRICS_TOKEN", "short")
	out.Reset()
	if code := serve(context.Background(), []string{"--api-key", "shared-key-1:alpha"}, &out, &out); code != 2 || !strings.Contains(out.String(), "metrics token") {
		t.Errorf("a short SBX_METRICS_TOKEN: exit %d: %s", code, out.String())
	}
}

// --llm-models is the list a request may choose from; --llm-model, the
// default, must be on it (the first of it when not given).
func TestLLMModelsFlag(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg, err := llmConfig(fs, "http://h/v1", "", " small, large ,small", "", 8, 20, 24000)
	if err != nil || cfg.Model != "small" || strings.Join(cfg.Models, ",") != "small,large" {
		t.Errorf("models without a default: %+v %v", cfg, err)
	}
	if cfg, err := llmConfig(fs, "http://h/v1", "large", "small,large", "", 8, 20, 24000); err != nil || cfg.Model != "large" {
		t.Errorf("a default on the list: %+v %v", cfg, err)
	}
	if _, err := llmConfig(fs, "http://h/v1", "huge", "small,large", "", 8, 20, 24000); err == nil || !strings.Contains(err.Error(), "--llm-models") {
		t.Errorf("a default not on the list: %v", err)
	}
	if cfg, err := llmConfig(fs, "http://h/v1", "m1", "", "", 8, 20, 24000); err != nil || len(cfg.Models) != 0 || cfg.Model != "m1" {
		t.Errorf("no list (the default alone): %+v %v", cfg, err)
	}
}

// --runtime-class and --user-namespaces reach the Kubernetes settings; a
// class sbx cannot use stops the server before it starts (exit 2).
func TestKubernetesFlags(t *testing.T) {
	k, err := kubernetesConfig("kc", "ns", "reg", []string{"runsc=gvisor", "kata"}, true)
	if err != nil || k.RuntimeClasses["runsc"] != "gvisor" || k.RuntimeClasses["runc"] != "kata" || !k.UserNamespaces ||
		k.Kubeconfig != "kc" || k.Namespace != "ns" || k.Registry != "reg" {
		t.Errorf("kubernetes settings: %+v, %v", k, err)
	}
	var out bytes.Buffer
	code := serve(context.Background(), []string{"--runtime", "kubernetes", "--runtime-class", "runsc=gVisor!"}, &out, &out)
	if code != 2 || !strings.Contains(out.String(), "RuntimeClass") {
		t.Errorf("a bad runtime class: exit %d: %s", code, out.String())
	}
}
