// Package redact masks the secret parts of PostgreSQL connection strings
// (DSNs) in text: a URL's userinfo password, the values of password= and
// sslpassword= (keyword/value pairs and URL query parameters).
//
// It masks them by the DSN's structure, where they appear as such, never by
// searching for the bare password: a password that is also a common word
// ("runledger", "postgres") would otherwise be masked in every line that
// holds the word, and what is masked would tell the password. The mask is a
// fixed token, so it tells neither the password's length nor its characters.
package redact

import (
	"encoding/json"
	"errors"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Mask replaces every secret; pgx masks with the same token.
const Mask = "xxxxx"

// secretKeys are the connection parameters whose values are secrets.
var secretKeys = map[string]bool{"password": true, "sslpassword": true}

// DSN returns dsn, a whole connection string, with its secrets masked. It
// follows the parser's rules (libpq's, as pgx implements them), and masks
// the rest of a string it cannot parse from where parsing fails.
func DSN(dsn string) string {
	if scheme := urlScheme.FindString(dsn); scheme != "" {
		return maskURL(scheme, dsn[len(scheme):])
	}
	return maskKeywordValue(dsn)
}

// urlScheme matches the scheme of a URL, "postgres://" or any other.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

func maskURL(scheme, p string) string {
	var b strings.Builder
	b.WriteString(scheme)
	// Like libpq, only a '/' ends the search for the userinfo's '@'.
	at := -1
	if i := strings.IndexAny(p, "@/"); i >= 0 && p[i] == '@' {
		at = i
	}
	after := p[at+1:]
	netloc := after
	if i := strings.IndexAny(after, "/?"); i >= 0 {
		netloc = after[:i]
	}
	switch j := strings.LastIndexByte(p, '@'); {
	case j > at && !numericPorts(netloc) && strings.IndexByte(p[:j], ':') >= 0:
		// An unencoded '/', '@' or ':' in a password makes the parser take
		// part of it for a host or port and strands an '@' after it
		// (postgres://u:pass/word@h, postgres://u:p@ss:w@h): mask from the
		// first ':' to the last '@'.
		c := strings.IndexByte(p, ':')
		b.WriteString(p[:c+1] + Mask)
		p = p[j:]
	case at >= 0:
		user, _, hasPassword := strings.Cut(p[:at], ":")
		b.WriteString(user)
		if hasPassword {
			b.WriteString(":" + Mask)
		}
		b.WriteByte('@')
		p = after
	}
	q := strings.IndexByte(p, '?')
	if q < 0 {
		b.WriteString(p)
		return b.String()
	}
	b.WriteString(p[:q+1])
	for i, pair := range strings.Split(p[q+1:], "&") {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(maskQueryPair(pair))
	}
	return b.String()
}

// numericPorts reports whether every port of a URL's host list
// (h1:p1,[::1]:p2) is digits or empty.
func numericPorts(netloc string) bool {
	for _, h := range strings.Split(netloc, ",") {
		if strings.HasPrefix(h, "[") {
			if k := strings.IndexByte(h, ']'); k >= 0 {
				h = h[k+1:]
			}
		}
		_, port, _ := strings.Cut(h, ":")
		if strings.Trim(port, "0123456789") != "" {
			return false
		}
	}
	return true
}

// maskQueryPair masks the value of a key=value query pair with a secret key,
// percent-encoded or not.
func maskQueryPair(pair string) string {
	key, _, ok := strings.Cut(pair, "=")
	if !ok || !secretKeys[strings.TrimSpace(percentDecode(key))] {
		return pair
	}
	return key + "=" + Mask
}

// percentDecode decodes %XX escapes, leaving malformed ones as they are.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// maskKeywordValue masks the secret values of a keyword/value connection
// string, tokenized as libpq does: keyword, optional spaces, '=', optional
// spaces, a value quoted with '...' or not, a backslash escaping the next
// character in both.
func maskKeywordValue(s string) string {
	var b strings.Builder
	i, lastSecret := 0, false
	for {
		start := i
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			b.WriteString(s[start:])
			return b.String()
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || strings.ContainsAny(strings.TrimRight(s[i:i+eq], spaces), spaces) {
			// Not a keyword: after a secret, or before one, the rest may hold a
			// password that its quoting split.
			if lastSecret || strings.Contains(s[i:], "password") {
				b.WriteString(s[start:i] + Mask)
			} else {
				b.WriteString(s[start:])
			}
			return b.String()
		}
		key := strings.TrimSpace(s[i : i+eq])
		i += eq + 1
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		end, ok := valueEnd(s, i)
		b.WriteString(s[start:i])
		lastSecret = secretKeys[key]
		switch {
		case !ok: // an unterminated quote
			b.WriteString(Mask)
			return b.String()
		case lastSecret && end > i:
			b.WriteString(Mask)
		default:
			b.WriteString(s[i:end])
		}
		i = end
	}
}

// valueEnd returns the end of the keyword/value value that starts at i, and
// false for a quote that is never closed.
func valueEnd(s string, i int) (int, bool) {
	if i < len(s) && s[i] == '\'' {
		return quotedEnd(s, i, false)
	}
	j := i
	for ; j < len(s) && !isSpace(s[j]); j++ {
		if s[j] == '\\' {
			j++
		}
	}
	return min(j, len(s)), true
}

// quotedEnd returns the end of the '...' value that starts at i (a backslash
// escapes the next character), and false for a quote never closed (within
// the line, when the value is embedded in text: atNewline).
func quotedEnd(s string, i int, atNewline bool) (int, bool) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '\'':
			return j + 1, true
		case '\n':
			if atNewline {
				return j, false
			}
		}
	}
	return len(s), false
}

const spaces = " \t\n\r\v\f"

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// Text masks, in s, the secrets of every connection string it holds, whose
// boundaries are unknown: a URL's userinfo password (up to the '@', within
// one word), and the value of password= or sslpassword= (a quoted value to
// its closing quote, else to a space, a quote of the enclosing text, or in
// a URL query to the next '&').
func Text(s string) string {
	s = embeddedURL.ReplaceAllStringFunc(s, func(m string) string {
		k := strings.Index(m, "://") + len("://")
		user, pass, _ := strings.Cut(m[k:len(m)-1], ":")
		if pass == "" {
			return m
		}
		return m[:k] + user + ":" + Mask + "@"
	})
	var b strings.Builder
	last := 0
	for _, m := range secretKey.FindAllStringSubmatchIndex(s, -1) {
		keyStart, i := m[2], m[1]
		if keyStart < last {
			continue // inside a value already masked
		}
		inQuery := keyStart > 0 && (s[keyStart-1] == '?' || s[keyStart-1] == '&')
		end := embeddedValueEnd(s, i, inQuery)
		if end == i || s[i:end] == Mask {
			continue
		}
		b.WriteString(s[last:i] + Mask)
		last = end
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// embeddedURL matches "scheme://user:password@" within one word.
var embeddedURL = regexp.MustCompile("[A-Za-z][A-Za-z0-9+.-]*://[^\\s\"`/@:]*:[^\\s\"`/@]*@")

// secretKey matches a secret keyword and its '=', not as part of a longer
// word.
var secretKey = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.%-])((?:ssl)?password)=`)

func embeddedValueEnd(s string, i int, inQuery bool) int {
	if i < len(s) && s[i] == '\'' {
		end, _ := quotedEnd(s, i, true)
		return end
	}
	j := i
	for ; j < len(s); j++ {
		c := s[j]
		if isSpace(c) || c == '"' || c == '`' || inQuery && (c == '&' || c == '#') {
			break
		}
		if c == '\\' && j+1 < len(s) && s[j+1] != '"' {
			j++ // an escaped character; \" ends a value in quoted text
		}
	}
	return min(j, len(s))
}

// Redactor masks the secrets of one DSN, in the forms a log line or an error
// can hold it (as it is, quoted by Go or JSON), and the secrets of any
// connection string in the rest of the text (Text).
type Redactor struct {
	forms, masked []string // the DSN's forms, and the same masked; none without a secret
}

// New returns the redactor of dsn (which may be empty).
func New(dsn string) *Redactor {
	r := &Redactor{}
	masked := DSN(dsn)
	if dsn == "" || masked == dsn {
		return r
	}
	for _, f := range []func(string) string{
		func(s string) string { return s },
		func(s string) string { q := strconv.Quote(s); return q[1 : len(q)-1] },
		func(s string) string { q, _ := json.Marshal(s); return string(q[1 : len(q)-1]) },
	} {
		if form := f(dsn); !slices.Contains(r.forms, form) {
			r.forms, r.masked = append(r.forms, form), append(r.masked, f(masked))
		}
	}
	return r
}

// String returns s with the secrets masked.
func (r *Redactor) String(s string) string {
	var b strings.Builder
	for {
		at, form := -1, 0
		for i, f := range r.forms {
			if j := strings.Index(s, f); j >= 0 && (at < 0 || j < at) {
				at, form = j, i
			}
		}
		if at < 0 {
			b.WriteString(Text(s))
			return b.String()
		}
		// Text only between the DSN's occurrences: they are masked already,
		// with the boundaries Text would have to guess.
		b.WriteString(Text(s[:at]) + r.masked[form])
		s = s[at+len(r.forms[form]):]
	}
}

// Error returns err with its message masked; the result no longer wraps err,
// whose chain could still print a secret. An error without a secret is
// returned as it is.
func (r *Redactor) Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := r.String(msg); red != msg {
		return errors.New(red)
	}
	return err
}

// Writer writes to w with the secrets masked. Each Write is masked on its
// own: loggers and printers write whole lines at a time.
func (r *Redactor) Writer(w io.Writer) io.Writer {
	return &writer{w: w, r: r}
}

type writer struct {
	mu sync.Mutex
	w  io.Writer
	r  *Redactor
}

func (w *writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := io.WriteString(w.w, w.r.String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
