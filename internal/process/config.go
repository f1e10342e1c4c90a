package process

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
// A file that does not fit v's schema (ConfigKinds) is refused with every
// problem in config words, each with its line: `FILE:3:16:
// queue.queue_timeout: "30" is not a duration; write "30s"`.
func loadYAML(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := checkLoad(path, data, v); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
