package telemetry

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestConfigured: which environments turn traces on, with what protocol,
// and which are refused at start; an endpoint's password never shows.
func TestConfigured(t *testing.T) {
	vars := []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"}
	for _, tc := range []struct {
		name               string
		env                map[string]string
		endpoint, protocol string
		err                string // a part of the error; "" for none
	}{
		{name: "nothing set: off"},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
			endpoint: "http://127.0.0.1:4318", protocol: "http/protobuf"},
		{name: "traces endpoint wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://b/v1/traces"},
			endpoint: "https://b/v1/traces", protocol: "http/protobuf"},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			endpoint: "http://c:4317", protocol: "grpc"},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			endpoint: "http://c:4318", protocol: "http/json"},
		{name: "password hidden", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://u:secret@d:4318"},
			endpoint: "https://u:xxxxx@d:4318", protocol: "http/protobuf"},
		{name: "disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_SDK_DISABLED": "true"}},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "exporter zipkin", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, err: "otlp only"},
		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, err: "want http/protobuf"},
		{name: "not a URL", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "e:4318"}, err: "want an http:// or https:// URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range vars {
				t.Setenv(v, tc.env[v])
			}
			endpoint, protocol, err := configured()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || endpoint != tc.endpoint || protocol != tc.protocol {
				t.Errorf("got %q %q %v, want %q %q", endpoint, protocol, err, tc.endpoint, tc.protocol)
			}
		})
	}
}

// TestSetupOff: without an endpoint Setup installs nothing, so spans stay
// OpenTelemetry's no-op ones, and its shutdown does nothing.
func TestSetupOff(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	before := otel.GetTracerProvider()
	shutdown, err := Setup(context.Background(), "sbx", "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if otel.GetTracerProvider() != before {
		t.Error("Setup without an endpoint installed a tracer provider")
	}
	_, span := otel.Tracer("test").Start(context.Background(), "x")
	if span.IsRecording() {
		t.Error("a span records with traces off")
	}
	if err := shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}
