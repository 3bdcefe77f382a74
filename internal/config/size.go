package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// sizeUnits are the accepted unit suffixes of a size, largest first. Only
// binary units: "GB" could mean 10^9 or 2^30, and a memory limit that is
// 7% off is a silent surprise.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{
	{"TiB", 1 << 40},
	{"GiB", 1 << 30},
	{"MiB", 1 << 20},
	{"KiB", 1 << 10},
	{"B", 1},
}

// decimalUnits are unit spellings refused with a hint at the binary unit
// (compared without regard to case).
var decimalUnits = []string{"k", "kb", "m", "mb", "g", "gb", "t", "tb", "p", "pb", "e", "eb"}

// sizeSyntax describes the size syntax in messages.
const sizeSyntax = "an integer number of bytes, or an integer with a unit B, KiB, MiB, GiB or TiB, such as 4GiB"

// maxShownUnit bounds a unit a message repeats; a longer suffix is not a
// unit at all.
const maxShownUnit = 8

// ParseSize parses a byte size: decimal digits, optionally followed
// directly by one of the units B, KiB, MiB, GiB, TiB ("4GiB", "512MiB",
// "1048576"). Signs, fractions, spaces, leading zeros, decimal units
// (KB, MB, GB...), other bases and results past math.MaxInt64 are refused;
// the error text says which.
func ParseSize(s string) (int64, error) {
	if strings.ContainsFunc(s, unicode.IsSpace) {
		return 0, errors.New("must be written without spaces, such as 4GiB")
	}
	if strings.HasPrefix(s, "-") && len(s) > 1 && isDigit(s[1]) {
		return 0, errors.New("must not be negative")
	}
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	digits, unit := s[:i], s[i:]
	if digits == "" {
		return 0, errors.New("must be " + sizeSyntax)
	}
	if strings.HasPrefix(unit, ".") || strings.HasPrefix(unit, ",") {
		return 0, errors.New("must be a whole number: use a smaller unit instead of a fraction (1536MiB, not 1.5GiB)")
	}
	mult := int64(0)
	for _, u := range sizeUnits {
		if unit == u.suffix {
			mult = u.bytes
		}
	}
	if unit == "" {
		mult = 1
	}
	if mult == 0 {
		switch {
		case isDecimalUnit(unit):
			return 0, fmt.Errorf("unit `%s` is not accepted: use the binary units B, KiB, MiB, GiB or TiB (1GiB = 1024MiB)", unit)
		case len(unit) <= maxShownUnit && isLetters(unit):
			return 0, fmt.Errorf("unknown unit `%s` (use B, KiB, MiB, GiB or TiB)", unit)
		default:
			return 0, errors.New("must be " + sizeSyntax)
		}
	}
	if len(digits) > 1 && digits[0] == '0' {
		return 0, errors.New("must not have leading zeros")
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("is too large (at most %d bytes)", int64(math.MaxInt64))
	}
	return n * mult, nil
}

// FormatSize writes n in the largest unit that divides it exactly ("4GiB",
// "1536MiB", "1000B"); ParseSize reads it back.
func FormatSize(n int64) string {
	for _, u := range sizeUnits {
		if n != 0 && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isLetters(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return s != ""
}

func isDecimalUnit(u string) bool {
	for _, d := range decimalUnits {
		if strings.EqualFold(u, d) {
			return true
		}
	}
	return false
}
