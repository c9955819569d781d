package oci

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testenv.WithCleanup(m)) }
