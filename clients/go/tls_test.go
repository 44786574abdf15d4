package ringlock_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

// pki is a CA and certificates it signed, as PEM files in a directory.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), caCert: cert, caKey: key}
	p.write(t, name+".pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, file, kind string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, file)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue makes a certificate for name (an IP address or a DNS name) and
// returns the paths of its PEM certificate and key.
func (p *pki) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+".key", "PRIVATE KEY", kder)
}

func (p *pki) ca(name string) string { return filepath.Join(p.dir, name+".pem") }

// Mutual TLS against the real server: a client with a certificate from the
// client CA locks; one without is refused with a TLS error that says so;
// a plain-text client is told the port speaks TLS.
func TestMutualTLS(t *testing.T) {
	nodes := newPKI(t, "node-ca")
	clients := newPKI(t, "client-ca")
	cert, key := nodes.issue(t, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	n := startSingle(t, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", clients.ca("client-ca"))
	ctx := ctxFor(t, 20*time.Second)

	ccert, ckey := clients.issue(t, "job", x509.ExtKeyUsageClientAuth)
	conf, err := ringlock.LoadTLS(nodes.ca("node-ca"), ccert, ckey, "")
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, []string{n.addr}, &ringlock.Options{TLS: conf})
	l, err := c.Lock(ctx, "tls", 5*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
	if st, err := ringlock.QueryStatus(ctx, n.addr, conf, time.Second); err != nil || st.Role != "active" {
		t.Fatalf("QueryStatus over TLS: %+v %v", st, err)
	}
	if _, _, err := ringlock.ListLocks(ctx, n.addr, conf, "", 0, 10, time.Second); err != nil {
		t.Fatalf("ListLocks over TLS: %v", err)
	}

	// No client certificate.
	noCert, err := ringlock.LoadTLS(nodes.ca("node-ca"), "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = ringlock.Connect(ctx, []string{n.addr}, &ringlock.Options{TLS: noCert})
	if !errors.Is(err, ringlock.ErrConnection) || !strings.Contains(err.Error(), "requires a client certificate") {
		t.Fatalf("without a client certificate: %v", err)
	}
	// A client certificate from another CA than the node's client CA.
	stranger, skey := nodes.issue(t, "stranger", x509.ExtKeyUsageClientAuth)
	strangerConf, _ := ringlock.LoadTLS(nodes.ca("node-ca"), stranger, skey, "")
	_, err = ringlock.Connect(ctx, []string{n.addr}, &ringlock.Options{TLS: strangerConf})
	// (crypto/tls sends none when ours is not from a CA the node names.)
	if !errors.Is(err, ringlock.ErrConnection) || !strings.Contains(err.Error(), "requires a client certificate signed by its client CA") {
		t.Fatalf("client certificate of another CA: %v", err)
	}
	// A server certificate from a CA we do not trust.
	other := newPKI(t, "other-ca")
	wrongCA, _ := ringlock.LoadTLS(other.ca("other-ca"), ccert, ckey, "")
	_, err = ringlock.Connect(ctx, []string{n.addr}, &ringlock.Options{TLS: wrongCA})
	if !errors.Is(err, ringlock.ErrConnection) || !strings.Contains(err.Error(), "not signed by the CA given") {
		t.Fatalf("untrusted server certificate: %v", err)
	}
	// A name the certificate does not carry.
	wrongName, _ := ringlock.LoadTLS(nodes.ca("node-ca"), ccert, ckey, "lock.example")
	_, err = ringlock.Connect(ctx, []string{n.addr}, &ringlock.Options{TLS: wrongName})
	if !errors.Is(err, ringlock.ErrConnection) || !strings.Contains(err.Error(), "does not name") {
		t.Fatalf("wrong server name: %v", err)
	}
	// Plain text at a TLS port.
	_, err = ringlock.Connect(ctx, []string{n.addr}, nil)
	if !errors.Is(err, ringlock.ErrConnection) || !strings.Contains(err.Error(), "this port speaks TLS") {
		t.Fatalf("plain text at a TLS port: %v", err)
	}
	// Bad files are refused before any connection.
	if _, err := ringlock.LoadTLS(filepath.Join(nodes.dir, "missing.pem"), "", "", ""); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Fatalf("missing CA file: %v", err)
	}
	if _, err := ringlock.LoadTLS(nodes.ca("node-ca"), ccert, "", ""); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Fatalf("certificate without key: %v", err)
	}
	if _, err := ringlock.LoadTLS(nodes.ca("node-ca"), ccert, key, ""); !errors.Is(err, ringlock.ErrInvalidArgument) {
		t.Fatalf("a key that does not match: %v", err)
	}
}

// An acquire outside the rules of the client certificate's identity
// (--acl) is ErrNotAllowed at once, not retried, and the identity may
// still lock what its rules allow.
func TestNotAllowedByTheRules(t *testing.T) {
	nodes := newPKI(t, "node-ca")
	clients := newPKI(t, "client-ca")
	cert, key := nodes.issue(t, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	// The client certificate's identity is its DNS name, "job".
	acl := filepath.Join(clients.dir, "acl")
	if err := os.WriteFile(acl, []byte("job a/ lock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startSingle(t, "--tls-cert", cert, "--tls-key", key,
		"--tls-client-ca", clients.ca("client-ca"), "--acl", acl)
	ctx := ctxFor(t, 20*time.Second)
	ccert, ckey := clients.issue(t, "job", x509.ExtKeyUsageClientAuth)
	conf, err := ringlock.LoadTLS(nodes.ca("node-ca"), ccert, ckey, "")
	if err != nil {
		t.Fatal(err)
	}
	c := connect(t, []string{n.addr}, &ringlock.Options{TLS: conf})
	started := time.Now()
	_, err = c.Lock(ctx, "b/x", 5*time.Second, 5*time.Second)
	if !errors.Is(err, ringlock.ErrNotAllowed) || !strings.Contains(err.Error(), `identity "job" may not lock "b/x"`) {
		t.Fatalf("outside the rules: %v", err)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("a refusal is not retried, but it took %v", took)
	}
	l, err := c.Lock(ctx, "a/x", 5*time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Release(ctx); !ok || err != nil {
		t.Fatalf("release: %v %v", ok, err)
	}
}
