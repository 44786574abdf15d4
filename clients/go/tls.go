package ringlock

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// LoadTLS makes the TLS configuration of Options.TLS from PEM files: caFile
// holds the CA certificates that sign the nodes' certificates (only those
// are trusted, not the system's); certFile and keyFile, both or neither,
// this client's certificate chain and private key, for nodes that require
// one (--tls-client-ca). serverName, if not empty, is the name every
// node's certificate must carry instead of the host of the address dialed.
// TLS 1.2 or 1.3. A missing file, a file with no certificate, or a key that
// does not match is ErrInvalidArgument.
func LoadTLS(caFile, certFile, keyFile, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, newError(ErrInvalidArgument, fmt.Sprintf("cannot read the CA file: %v", err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, newError(ErrInvalidArgument, caFile+" holds no PEM certificate")
	}
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: serverName}
	switch {
	case certFile != "" && keyFile != "":
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, newError(ErrInvalidArgument, fmt.Sprintf("%s and %s do not make a usable client certificate: %v", certFile, keyFile, err))
		}
		conf.Certificates = []tls.Certificate{pair}
	case certFile != "" || keyFile != "":
		return nil, newError(ErrInvalidArgument, "a client certificate needs both its certificate and its key file")
	}
	return conf, nil
}

// checkTLS refuses a configuration that does not verify, and makes sure
// of TLS 1.2 or later.
func checkTLS(conf *tls.Config) (*tls.Config, error) {
	if conf.InsecureSkipVerify {
		return nil, newError(ErrInvalidArgument, "a TLS configuration with InsecureSkipVerify: the client always verifies the nodes' certificates")
	}
	conf = conf.Clone()
	if conf.MinVersion < tls.VersionTLS12 {
		conf.MinVersion = tls.VersionTLS12
	}
	return conf, nil
}

// forAddr is conf with the name to check for addr: its ServerName if set,
// else the host dialed.
func forAddr(conf *tls.Config, addr string) *tls.Config {
	if conf.ServerName != "" {
		return conf
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	conf = conf.Clone()
	conf.ServerName = strings.Trim(host, "[]")
	return conf
}

// explain says what an I/O error means: a TLS failure in words, anything
// else as the system says it.
func explain(err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var header tls.RecordHeaderError
	var op *net.OpError
	var verify *tls.CertificateVerificationError
	switch {
	case errors.As(err, &unknown):
		return "TLS: the server's certificate is not signed by the CA given (" + err.Error() + ")"
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return "TLS: the server's certificate has expired or is not valid yet (" + err.Error() + ")"
	case errors.As(err, &host):
		return "TLS: the server's certificate does not name the address dialed (see LoadTLS's serverName) (" + err.Error() + ")"
	case errors.As(err, &verify):
		return "TLS: the server's certificate was refused (" + err.Error() + ")"
	case errors.As(err, &header):
		return "TLS: the server did not answer in TLS (a plain-text port?)"
	case errors.As(err, &op) && op.Op == "remote error":
		// An alert from the server (crypto/tls keeps their type to itself).
		msg := op.Err.Error()
		switch {
		case strings.Contains(msg, "certificate required"):
			// crypto/tls sends no certificate when ours is not signed by
			// a CA the server names, so this covers both cases.
			return "TLS: the server requires a client certificate signed by its client CA (none given, or ours is from another CA: see LoadTLS)"
		case strings.Contains(msg, "unknown certificate authority"), strings.Contains(msg, "bad certificate"):
			return "TLS: the server does not accept our client certificate (not signed by its client CA)"
		case strings.Contains(msg, "expired certificate"):
			return "TLS: the server refused our client certificate: it has expired"
		}
		return "TLS: " + msg
	}
	return err.Error()
}
