package podrunner

import "strings"

// expand replaces $(NAME) in s with lookup(NAME) the way the kubelet does for
// env values, command and args: $$ is a literal $, so $$(NAME) stays
// $(NAME); a $(NAME) that lookup does not know stays as written; a $ followed by
// anything else, or a $( without a closing ), is kept.
func expand(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += end + 2
		default:
			b.WriteByte('$')
			b.WriteByte(s[i+1])
			i++
		}
	}
	return b.String()
}
