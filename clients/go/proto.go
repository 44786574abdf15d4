package ringlock

import (
	"bytes"
	"fmt"
	"strconv"
	"time"
)

// Limits of the protocol (docs/protocol.md, section 3).
const (
	// MaxKeyLen is the longest key the protocol allows, in bytes.
	MaxKeyLen = 250
	// MaxDuration is the longest lease or wait the protocol allows.
	MaxDuration = 86400 * time.Second
	// MaxWaitingAcquires is the most acquires the protocol lets wait on
	// one connection; the client queues further ones locally.
	MaxWaitingAcquires = 4096
	// TryWait is the wait of TryLock: the shortest the protocol allows (a
	// wait of 0 means no limit).
	TryWait = time.Millisecond
	// maxAnswerLine is the longest answer line read on a pooled
	// connection (the longest legal one is about 500 bytes).
	maxAnswerLine = 4096
	// maxHealthLine is the longest H answer line read: problems quote
	// peer addresses and whole --peers lists.
	maxHealthLine = 64 * 1024
	// maxRedirectAddrs is the most addresses M answers may add to the
	// given ones (a cluster has at most 16 nodes).
	maxRedirectAddrs = 16
)

// op is the first byte of a request or answer.
type op byte

const (
	opAcquire op = 'A'
	opRelease op = 'R'
	opRenew   op = 'N'
	opStatus  op = 'S'
	opShared  op = 'G'
	opPermit  op = 'C'
)

// answer is one parsed answer line.
type answer struct {
	op    byte   // A T M R N S H K L E G C
	key   string // A T M R N K G C
	token uint64 // A G C (token; 0 for G/C: the wait ran out), S (token), K (token), L (cursor)
	wrong bool   // G C: refused for the key's kind
	limit int    // G C refused: the live semaphore's limit (1..65536), 0: a lock (C only)
	flag  bool   // R N: 1 or 0
	addr  string // M S: "" for "-"
	role  string // S: active or standby
	text  string // E reason, H problem ("" for ok)
	lease uint64 // K lease_ms
	waits uint64 // K waiters
}

// isKeyByte says whether b may appear in a key: 0x21..=0x7E or >= 0x80.
func isKeyByte(b byte) bool {
	return (b >= 0x21 && b <= 0x7e) || b >= 0x80
}

// validKey says whether key is a key of the protocol.
func validKey(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if !isKeyByte(key[i]) {
			return false
		}
	}
	return true
}

// checkKey refuses a key the protocol does not allow.
func checkKey(key string) error {
	switch {
	case len(key) == 0:
		return newError(ErrInvalidArgument, "empty key")
	case len(key) > MaxKeyLen:
		return newError(ErrInvalidArgument, fmt.Sprintf("key of %d bytes (at most %d)", len(key), MaxKeyLen))
	case !validKey(key):
		return newError(ErrInvalidArgument, fmt.Sprintf("key %q has a space or control byte", key))
	}
	return nil
}

func checkToken(token uint64) error {
	if token == 0 {
		return newError(ErrInvalidArgument, "token 0 (tokens start at 1)")
	}
	return nil
}

// leaseMs is a lease in whole milliseconds, rounded down: 1 ms to 86400 s.
func leaseMs(lease time.Duration) (uint64, error) {
	ms := lease.Milliseconds()
	if ms <= 0 {
		return 0, newError(ErrInvalidArgument, fmt.Sprintf("lease %v (at least 1ms)", lease))
	}
	if lease > MaxDuration {
		return 0, newError(ErrInvalidArgument, fmt.Sprintf("lease %v (at most 86400s)", lease))
	}
	return uint64(ms), nil
}

// waitMs is a wait in whole milliseconds, rounded up so that a tiny wait
// does not become 0 ("no limit"); zero is no limit.
func waitMs(wait time.Duration) (uint64, error) {
	if wait < 0 {
		return 0, newError(ErrInvalidArgument, fmt.Sprintf("wait %v (negative)", wait))
	}
	if wait > MaxDuration {
		return 0, newError(ErrInvalidArgument, fmt.Sprintf("wait %v (at most 86400s)", wait))
	}
	return ceilMs(wait), nil
}

// ceilMs is d in milliseconds, rounded up.
func ceilMs(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

// appendSeconds writes ms as protocol seconds: "30", "1.5", "0.001".
func appendSeconds(b []byte, ms uint64) []byte {
	b = strconv.AppendUint(b, ms/1000, 10)
	frac := ms % 1000
	if frac == 0 {
		return b
	}
	digits := []byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
	}
	b = append(b, '.')
	return append(b, digits...)
}

func acquireLine(key string, leaseMs, waitMs uint64) []byte {
	b := make([]byte, 0, len(key)+32)
	b = append(b, "A "...)
	b = append(b, key...)
	b = append(b, ' ')
	b = appendSeconds(b, leaseMs)
	b = append(b, ' ')
	b = appendSeconds(b, waitMs)
	return append(b, '\n')
}

// kindLine is the acquire request of kind k: A, G or C (with its limit).
func kindLine(k Kind, key string, leaseMs, waitMs uint64) []byte {
	if k.op == 0 {
		return acquireLine(key, leaseMs, waitMs)
	}
	b := make([]byte, 0, len(key)+40)
	b = append(b, byte(k.op), ' ')
	b = append(b, key...)
	b = append(b, ' ')
	if k.op == opPermit {
		b = strconv.AppendInt(b, int64(k.limit), 10)
		b = append(b, ' ')
	}
	b = appendSeconds(b, leaseMs)
	b = append(b, ' ')
	b = appendSeconds(b, waitMs)
	return append(b, '\n')
}

func releaseLine(key string, token uint64) []byte {
	b := make([]byte, 0, len(key)+24)
	b = append(b, "R "...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, token, 10)
	return append(b, '\n')
}

func renewLine(key string, token, leaseMs uint64) []byte {
	b := make([]byte, 0, len(key)+32)
	b = append(b, "N "...)
	b = append(b, key...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, token, 10)
	b = append(b, ' ')
	b = appendSeconds(b, leaseMs)
	return append(b, '\n')
}

func listLine(cursor uint64, limit int, prefix string) []byte {
	b := make([]byte, 0, len(prefix)+32)
	b = append(b, "L "...)
	b = strconv.AppendUint(b, cursor, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(limit), 10)
	if prefix != "" {
		b = append(b, ' ')
		b = append(b, prefix...)
	}
	return append(b, '\n')
}

// parseU64 reads a decimal u64: ASCII digits only (leading zeros allowed),
// no sign, no overflow.
func parseU64(f []byte) (uint64, bool) {
	if len(f) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range f {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// parseKindAnswer reads what follows the key of a G or C answer: a token
// (0: the wait ran out), "semaphore N" (N from 1 to MaxPermits), or, for
// C only, "lock".
func parseKindAnswer(a *answer, rest [][]byte) bool {
	switch {
	case len(rest) == 1 && a.op == 'C' && string(rest[0]) == "lock":
		a.wrong = true
		return true
	case len(rest) == 1:
		var ok bool
		a.token, ok = parseU64(rest[0])
		return ok
	case len(rest) == 2 && string(rest[0]) == "semaphore":
		n, ok := parseU64(rest[1])
		if !ok || n < 1 || n > MaxPermits {
			return false
		}
		a.wrong, a.limit = true, int(n)
		return true
	}
	return false
}

// parseAnswer parses one answer line (without its "\n"; a "\r" before it
// is tolerated). It never panics, whatever the bytes.
func parseAnswer(line []byte) (answer, error) {
	line = bytes.TrimSuffix(line, []byte{'\r'})
	bad := func() (answer, error) {
		shown := line
		if len(shown) > 200 {
			shown = shown[:200]
		}
		return answer{}, fmt.Errorf("malformed answer %q", shown)
	}
	if rest, ok := bytes.CutPrefix(line, []byte("E ")); ok {
		return answer{op: 'E', text: string(rest)}, nil
	}
	if rest, ok := bytes.CutPrefix(line, []byte("H ")); ok {
		a := answer{op: 'H'}
		if string(rest) != "ok" {
			a.text = string(rest)
		}
		return a, nil
	}
	fields := bytes.Split(line, []byte{' '})
	if len(fields) < 2 || len(fields[0]) != 1 {
		return bad()
	}
	key := func() (string, bool) {
		k := string(fields[1])
		return k, validKey(k)
	}
	flag := func(f []byte) (bool, bool) {
		switch string(f) {
		case "1":
			return true, true
		case "0":
			return false, true
		}
		return false, false
	}
	a := answer{op: fields[0][0]}
	ok := false
	switch {
	case a.op == 'A' && len(fields) == 3:
		if a.key, ok = key(); ok {
			a.token, ok = parseU64(fields[2])
			ok = ok && a.token > 0
		}
	case a.op == 'T' && len(fields) == 2:
		a.key, ok = key()
	case a.op == 'M' && len(fields) == 3 && len(fields[2]) > 0:
		if a.key, ok = key(); ok && string(fields[2]) != "-" {
			a.addr = string(fields[2])
		}
	case (a.op == 'R' || a.op == 'N') && len(fields) == 3:
		if a.key, ok = key(); ok {
			a.flag, ok = flag(fields[2])
		}
	case a.op == 'S' && len(fields) == 4 && len(fields[2]) > 0:
		a.role = string(fields[1])
		ok = a.role == "active" || a.role == "standby"
		if string(fields[2]) != "-" {
			a.addr = string(fields[2])
		}
		if ok {
			a.token, ok = parseU64(fields[3])
		}
	case a.op == 'K' && len(fields) == 5:
		if a.key, ok = key(); ok {
			var ok2, ok3 bool
			a.token, ok = parseU64(fields[2])
			a.lease, ok2 = parseU64(fields[3])
			a.waits, ok3 = parseU64(fields[4])
			ok = ok && ok2 && ok3
		}
	case a.op == 'L' && len(fields) == 2:
		a.token, ok = parseU64(fields[1])
	case (a.op == 'G' || a.op == 'C') && (len(fields) == 3 || len(fields) == 4):
		a.key, ok = key()
		ok = ok && parseKindAnswer(&a, fields[2:])
	}
	if !ok {
		return bad()
	}
	return a, nil
}
