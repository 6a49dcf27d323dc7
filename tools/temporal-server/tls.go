package main

import (
	"crypto/tls"
	"runtime"

	"go.temporal.io/server/common/rpc/encryption"
)

// httpAPIServer is the function that asks for the TLS config of an HTTP API listener
// (service/frontend/http_api_server.go in v1.32.2). It asks for the *frontend* config on
// both frontends; the internal frontend's HTTP port is where the server's own components
// deliver Nexus requests and callbacks, and they dial it with the internode client config.
const httpAPIServer = "go.temporal.io/server/service/frontend.NewHTTPAPIServer"

// httpOverInternode gives every HTTP API listener the internode server config (mutual TLS
// with the server's own certificate), while the public frontend's gRPC port keeps the
// frontend config (no TLS here: its callers show a token instead).
//
// Why: the server's components call the internal frontend's HTTP port over internode TLS,
// but the stock server serves that port with the frontend config, so with internode TLS
// on and frontend TLS off the two would never meet. The HTTP ports carry only the Nexus
// API and a gRPC mirror that no triloop service uses, so none of their callers needs a
// token path; they need the server's certificate.
type httpOverInternode struct {
	encryption.TLSConfigProvider
}

// GetFrontendServerConfig is the internode config for an HTTP API listener, else the
// frontend's own.
func (p httpOverInternode) GetFrontendServerConfig() (*tls.Config, error) {
	if calledBy(httpAPIServer) {
		return p.GetInternodeServerConfig()
	}
	return p.TLSConfigProvider.GetFrontendServerConfig()
}

// calledBy says whether fn is on the caller's stack.
func calledBy(fn string) bool {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		frame, more := frames.Next()
		if frame.Function == fn {
			return true
		}
		if !more {
			return false
		}
	}
}
