module github.com/farmem/farmem

go 1.26.8

require golang.org/x/sys v0.38.0
