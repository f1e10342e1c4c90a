package request

import (
	"bytes"
	"encoding/json"
	"fmt"
	"iop/internal/jsonvalue"
	"math"
	"strconv"
	"strings"
)

// The JSON type a checked field must have, as an error message names it.
const (
	WantString  = "a string"
	WantBool    = "a boolean"
	WantInteger = "an integer"
	WantNumber  = "a number"
	WantArray   = "an array"
	WantObject  = "an object"
)

// checkInteger checks that v, when present, is a JSON integer in
// [min, max].
func checkInteger(v *jsonvalue.Value, param string, min, max int64) error {
	lit, err := numberLiteral(v, param, WantInteger)
	if lit == "" || err != nil {
		return err
	}
	if v, ok := parseInteger(lit); ok && v >= min && v <= max {
		return nil
	}
	if integralIn(lit, min, max) {
		return notPlainInteger(param, lit)
	}
	return &FieldError{Field: param, Message: fmt.Sprintf("must be an integer between %d and %d, got %s", min, max, Clip(lit))}
}

// checkNumber checks that v, when present, is a JSON number that fits a
// float64. (One too small to represent is 0, as encoding/json reads it.)
func checkNumber(v *jsonvalue.Value, param string) error {
	lit, err := numberLiteral(v, param, WantNumber)
	if lit == "" || err != nil {
		return err
	}
	if _, err := strconv.ParseFloat(lit, 64); err != nil {
		return &FieldError{Field: param, Message: "number out of range, got " + Clip(lit)}
	}
	return nil
}

// numberLiteral returns the JSON number literal v holds, "" if v is
// absent or null, or a *FieldError if v is another JSON type.
func numberLiteral(v *jsonvalue.Value, param, want string) (string, error) {
	if v.Absent() {
		return "", nil
	}
	if c := v.Kind(); c != '-' && (c < '0' || c > '9') {
		return "", &FieldError{Field: param, Message: fmt.Sprintf("expected %s, got %s", want, v.TypeName())}
	}
	return string(v.Raw), nil
}

// parseInteger returns the value of a JSON number literal written as an
// integer (no fraction, no exponent) that fits an int64.
func parseInteger(lit string) (int64, bool) {
	if strings.ContainsAny(lit, ".eE") {
		return 0, false
	}
	v, err := strconv.ParseInt(lit, 10, 64)
	return v, err == nil
}

// integralIn reports whether a JSON number literal has an integral value in
// [min, max] (as near as a float64 tells).
func integralIn(lit string, min, max int64) bool {
	f, err := strconv.ParseFloat(lit, 64)
	return err == nil && f == math.Trunc(f) && f >= float64(min) && f < float64(max)+1
}

func notPlainInteger(param, lit string) error {
	return &FieldError{Field: param, Message: "must be an integer written without a fraction or exponent, got " + Clip(lit)}
}

// checkType checks that v, when present and not null, has the JSON type
// want names; else a *FieldError naming param.
func checkType(v *jsonvalue.Value, param, want string) error {
	if v.Absent() {
		return nil
	}
	var ok bool
	switch k := v.Kind(); want {
	case WantString:
		ok = k == '"'
	case WantBool:
		ok = k == 't' || k == 'f'
	case WantArray:
		ok = k == '['
	case WantObject:
		ok = k == '{'
	case WantNumber, WantInteger:
		ok = k == '-' || k >= '0' && k <= '9'
	}
	if !ok {
		return &FieldError{Field: param, Message: fmt.Sprintf("expected %s, got %s", want, v.TypeName())}
	}
	return nil
}

// stringOf is v's text when v is a string, "" when absent or null, else a
// *FieldError naming param.
func stringOf(v *jsonvalue.Value, param string) (string, error) {
	if err := checkType(v, param, WantString); err != nil || v.Absent() {
		return "", err
	}
	return v.Text(), nil
}

// boolOf is v's value when v is a boolean, false when absent or null,
// else a *FieldError naming param.
func boolOf(v *jsonvalue.Value, param string) (bool, error) {
	if err := checkType(v, param, WantBool); err != nil {
		return false, err
	}
	return v.Kind() == 't', nil
}

// elemsOf is an array's elements; none for anything else.
func elemsOf(v *jsonvalue.Value) []jsonvalue.Value {
	if v.Kind() != '[' {
		return nil
	}
	return v.Elems
}

// DecodeValue decodes raw, the value of a request's parameter param, into
// dst; null or nothing leaves dst alone. A value of another JSON type is
// a *FieldError naming param: "expected <want>, got <its type>" (want:
// WantString, WantBool, WantObject, ...).
func DecodeValue(raw json.RawMessage, param, want string, dst any) error {
	if isAbsent(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return &FieldError{Field: param, Message: fmt.Sprintf("expected %s, got %s", want, jsonKind(raw))}
	}
	return nil
}

// isAbsent reports whether a raw value is missing or JSON null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || firstByte(raw) == 'n'
}

// firstByte is the first non-space byte of a JSON value, 0 if none.
func firstByte(raw []byte) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// jsonKind names the JSON type of a valid JSON value, for error messages.
func jsonKind(raw []byte) string { return jsonvalue.KindName(firstByte(raw)) }
