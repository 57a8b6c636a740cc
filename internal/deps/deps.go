// Package deps pins the module's chosen dependencies while the packages that
// use them are being written, so that `go mod tidy` keeps them.
package deps

import (
	_ "github.com/Masterminds/sprig/v3"
	_ "github.com/dave/jennifer/jen"
	_ "github.com/rogpeppe/go-internal/testscript"
	_ "github.com/spf13/cobra"
	_ "gopkg.in/yaml.v3"
)
