package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/ctrl"
)

func certCommand() *cli.Command {
	return &cli.Command{
		Name:  "cert",
		Usage: "make the cluster's TLS certificates: a CA, and a certificate for the ctrl",
		Description: "Makes the cluster CA in --dir (ca.pem, and its key ca-key.pem) unless it is there already,\n" +
			"then a certificate signed by it for the addresses clients dial the ctrl at (--host), as\n" +
			"NAME.pem and NAME-key.pem. The ctrl serves with --tls-cert NAME.pem --tls-key NAME-key.pem;\n" +
			"memory servers, clients and farmem status trust it with --ca ca.pem, as does\n" +
			"curl --cacert ca.pem -H \"Authorization: Bearer $(cat token)\" https://HOST:PORT/v1/status.\n" +
			"Keep ca-key.pem off the cluster's hosts: whoever has it can stand in for the ctrl.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "dir", Value: ".", Usage: "directory of the CA and the certificates (created if missing)"},
			&cli.StringFlag{Name: "host", Usage: "HOST[,HOST...]: the IP addresses and DNS names clients dial the ctrl at; required"},
			&cli.StringFlag{Name: "name", Value: "ctrl", Usage: "file name of the certificate: NAME.pem and NAME-key.pem"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem cert takes no arguments (got %q)", c.Args().First())
			}
			if c.String("host") == "" {
				return usagef("--host HOST[,HOST...] is required: the addresses clients dial the ctrl at")
			}
			hosts := strings.Split(c.String("host"), ",")
			name, dir := c.String("name"), c.String("dir")
			if name == "" || name == "ca" || strings.ContainsAny(name, "/\x00") {
				return usagef("--name %q: give a plain file name other than ca", name)
			}
			if err := ctrl.CheckCertHosts(hosts); err != nil {
				return usageError{err.Error()}
			}
			ca, key, made, err := ctrl.EnsureCA(dir)
			if err != nil {
				return err
			}
			out := c.App.Writer
			if made {
				fmt.Fprintf(out, "farmem cert: made the cluster CA %s (its key %s: keep it off the cluster's hosts)\n",
					filepath.Join(dir, ctrl.CAFile), filepath.Join(dir, ctrl.CAKeyFile))
			}
			cert, err := ctrl.IssueCert(dir, name, hosts, ca, key)
			if err != nil {
				return err
			}
			certPath, keyPath := ctrl.CertFiles(dir, name)
			fmt.Fprintf(out, "farmem cert: %s for %s, valid until %s\n", certPath, strings.Join(hosts, ", "), cert.NotAfter.Format("2006-01-02"))
			fmt.Fprintf(out, "  the ctrl:      farmem ctrl --tls-cert %s --tls-key %s ...\n", certPath, keyPath)
			fmt.Fprintf(out, "  every client:  --ca %s\n", filepath.Join(dir, ctrl.CAFile))
			return nil
		},
	}
}
