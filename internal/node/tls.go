package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// transportCredentials returns how the agent dials the edge: plaintext,
// or TLS when cfg sets tls, tls_ca or tls_cert (TLS 1.2 or later; the edge's
// certificate verified against tls_ca, else the system's roots, for
// tls_server_name, else the host of edge; the node's own certificate sent
// when tls_cert is set, for mutual TLS). Errors wrap ErrInvalidConfig and
// name the file that could not be used.
func transportCredentials(cfg Config) (credentials.TransportCredentials, error) {
	if !cfg.TLS && cfg.TLSCA == "" && cfg.TLSCert == "" {
		return insecure.NewCredentials(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.TLSServerName}
	if cfg.TLSCA != "" {
		pem, err := os.ReadFile(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("%w: tls_ca: %w", ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: tls_ca %s: no PEM certificate in it", ErrInvalidConfig, cfg.TLSCA)
		}
		tc.RootCAs = pool
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("%w: tls_cert/tls_key: %w", ErrInvalidConfig, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(tc), nil
}
