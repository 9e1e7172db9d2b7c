#!/bin/sh
FARMEM_DROP_ONLY=1 exec /tmp/farmem-dropvariant "$@"
