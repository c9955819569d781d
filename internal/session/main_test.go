package session_test

import (
	"testing"

	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) { runtimetest.Main(m) }
