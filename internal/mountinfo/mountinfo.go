// Package mountinfo reads what /proc/PID/mountinfo says of mount points.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes mountinfo's octal escapes of a path (\040 for a space,
// \011 for a tab, \012 for a newline, \134 for a backslash).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
