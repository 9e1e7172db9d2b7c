package ctrl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The cluster's certificates: one CA per cluster, kept by whoever runs `farmem cert`, and a
// certificate signed by it for each ctrl, naming the addresses clients dial. Clients trust the
// CA only (their --ca), so a certificate from any public CA cannot stand in for a ctrl.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
	caLife    = 10 * 365 * 24 * time.Hour
	certLife  = 2 * 365 * 24 * time.Hour
)

// CertFiles names a certificate and its key in dir: NAME.pem and NAME-key.pem.
func CertFiles(dir, name string) (cert, key string) {
	return filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
}

// EnsureCA loads the cluster CA from dir, or makes one if dir has none; made says which.
func EnsureCA(dir string) (ca *x509.Certificate, key *ecdsa.PrivateKey, made bool, err error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	if _, err := os.Stat(certPath); err == nil {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, nil, false, fmt.Errorf("loading the cluster CA from %s: %v", dir, err)
		}
		k, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, nil, false, fmt.Errorf("the cluster CA key %s is not an ECDSA key", keyPath)
		}
		return pair.Leaf, k, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, fmt.Errorf("reading the cluster CA: %v", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, false, fmt.Errorf("cannot create the certificate directory %s: %v", dir, cause(err))
	}
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "farmem cluster CA"},
		NotBefore:             now.Add(-time.Hour), // a host whose clock is a little behind still accepts it
		NotAfter:              now.Add(caLife),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, false, err
	}
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return nil, nil, false, err
	}
	ca, err = x509.ParseCertificate(der)
	return ca, key, true, err
}

// IssueCert signs a server certificate for hosts (DNS names or IP addresses) with the CA and
// writes it to dir as NAME.pem and NAME-key.pem, replacing any there.
func IssueCert(dir, name string, hosts []string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (*x509.Certificate, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "ca" {
		return nil, fmt.Errorf("--name %q: give a plain file name other than ca", name)
	}
	if err := CheckCertHosts(hosts); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certLife),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Client too: a ctrl may present the same certificate to an etcd that asks for one.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	certPath, keyPath := CertFiles(dir, name)
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// CheckCertHosts refuses a host a certificate cannot name: each is an IP address or a DNS name.
func CheckCertHosts(hosts []string) error {
	if len(hosts) == 0 {
		return fmt.Errorf("no --host given: name every address clients dial the ctrl at (IP addresses and DNS names)")
	}
	for _, h := range hosts {
		if net.ParseIP(h) == nil && (h == "" || strings.ContainsAny(h, " /:@")) {
			return fmt.Errorf("--host %q is neither an IP address nor a DNS name (give hosts without ports)", h)
		}
	}
	return nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// writePair writes a certificate (readable by all: it is public) and its key (by the owner only).
func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return fmt.Errorf("writing %s: %v", keyPath, cause(err))
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("writing %s: %v", certPath, cause(err))
	}
	return nil
}

// LoadCA reads the CA certificate(s) a client trusts the ctrl by (--ca).
func LoadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate (give the cluster CA, ca.pem from farmem cert)", path)
	}
	return pool, nil
}

// ServerTLS is the ctrl's TLS configuration from its certificate and key (--tls-cert, --tls-key).
func ServerTLS(certPath, keyPath string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("loading the ctrl's TLS certificate: %v", err)
	}
	// TLS 1.3 only: every client is farmem's own Go code, curl or another modern client, and
	// 1.3 has no 0-RTT in Go's server, so no record of one connection is accepted on another.
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS13}, nil
}

// EtcdTLS is the TLS configuration for etcd endpoints (--etcd-ca, --etcd-cert, --etcd-key): the
// CA that signed the etcd servers' certificates (empty: the system's roots), and the ctrl's
// client certificate and key for an etcd that checks its clients' (both empty: none).
func EtcdTLS(caPath, certPath, keyPath string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12} // etcd's own minimum
	if caPath != "" {
		pool, err := LoadCA(caPath)
		if err != nil {
			return nil, fmt.Errorf("--etcd-ca: %v", err)
		}
		cfg.RootCAs = pool
	}
	if certPath != "" || keyPath != "" {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return nil, fmt.Errorf("loading the ctrl's etcd client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
