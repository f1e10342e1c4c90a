package process

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"
)

// LoadConfig decodes the YAML file at path (if any; "" does nothing) into
// v, the struct the flags fs are bound to, then re-applies the flags the
// user set (fs.Visit), so flags override the file and the file overrides
// defaults. For a configuration read again (Config.Reload), reset (if set)
// is called after the set flags are noted and before the file is decoded:
// it puts v back to its defaults, so that what the file no longer says does
// not linger. Errors: the file cannot be read, does not decode into v or
// has a field v does not have (named with the file's path), or a flag
// cannot be set again (named --flag).
func LoadConfig(fs *pflag.FlagSet, path string, v any, reset func()) error {
	if path == "" {
		return nil
	}
	type setFlag struct {
		flag  *pflag.Flag
		value string
		slice []string
	}
	var set []setFlag
	fs.Visit(func(fl *pflag.Flag) {
		sf := setFlag{flag: fl, value: fl.Value.String()}
		if sl, ok := fl.Value.(pflag.SliceValue); ok {
			sf.slice = sl.GetSlice()
		}
		set = append(set, sf)
	})
	if reset != nil {
		reset()
	}
	if err := loadYAML(path, v); err != nil {
		return err
	}
	for _, sf := range set {
		var err error
		if sl, ok := sf.flag.Value.(pflag.SliceValue); ok {
			err = sl.Replace(sf.slice)
		} else {
			err = sf.flag.Value.Set(sf.value)
		}
		if err != nil {
			return fmt.Errorf("--%s: %w", sf.flag.Name, err)
		}
	}
	return nil
}

// loadYAML decodes the YAML file at path into v, rejecting unknown fields.
func loadYAML(path string, v any) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
