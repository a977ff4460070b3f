package route

import (
	"bufio"
	"encoding/base64"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestJavaUTF8MatchesTheJDK replays testdata/java-utf8.txt: for each input, what a real JDK's
// new String(input, UTF_8).getBytes(UTF_8) returned (the broker's reading of a partition key).
// The inputs are 6,000 random strings of 1 to 7 bytes drawn mostly from lead, continuation and
// boundary bytes. To check another JDK: javac -d /tmp route/testdata/JavaUTF8.java &&
// grep -v '^#' route/testdata/java-utf8.txt | cut -d' ' -f1 | java -cp /tmp JavaUTF8 | diff - <(grep -v '^#' route/testdata/java-utf8.txt).
func TestJavaUTF8MatchesTheJDK(t *testing.T) {
	f, err := os.Open("testdata/java-utf8.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	cases := 0
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		in, want, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("bad golden line %q", line)
		}
		inB, err1 := hex.DecodeString(in)
		wantB, err2 := hex.DecodeString(want)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad golden line %q", line)
		}
		if got, _ := AppendPartitionKey(nil, inB, false); string(got) != string(wantB) {
			t.Errorf("AppendPartitionKey(%x) = %x, the JDK gives %x", inB, got, wantB)
		}
		cases++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases < 1000 {
		t.Fatalf("only %d golden cases", cases)
	}
}

// FuzzJavaUTF8 checks the properties every input must have: the result is valid UTF-8, valid
// input is unchanged, and it grows by at most U+FFFD's three bytes per input byte.
func FuzzJavaUTF8(f *testing.F) {
	for _, s := range []string{"", "a", "clé", "\xff", "\xe2\x82", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xc0\xafb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := appendJavaUTF8(nil, s)
		if !utf8.Valid(got) {
			t.Fatalf("appendJavaUTF8(%q) = %q is not valid UTF-8", s, got)
		}
		if utf8.ValidString(s) && string(got) != s {
			t.Fatalf("appendJavaUTF8 changed valid input %q to %q", s, got)
		}
		if len(got) > 3*len(s) {
			t.Fatalf("appendJavaUTF8(%q) grew to %d bytes", s, len(got))
		}
	})
}

// FuzzAppendPartitionKey checks base64 keys against Go's own encoder: any bytes encoded padded
// or unpadded decode back to themselves after dst, a line break anywhere is refused (Java's
// decoder rejects what Go's would skip), and a string key is appended as its Java reading.
func FuzzAppendPartitionKey(f *testing.F) {
	for _, s := range []string{"", "k", "\xff\xe2\x82", "\x00\x01\x02\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding} {
			pk := []byte(enc.EncodeToString(raw))
			got, err := AppendPartitionKey([]byte("prefix"), pk, true)
			if err != nil || string(got) != "prefix"+string(raw) {
				t.Fatalf("AppendPartitionKey(%q, b64) = %q, %v; want prefix+%q", pk, got, err, raw)
			}
			if len(pk) > 0 {
				broken := append(append(append([]byte{}, pk[:len(pk)/2]...), '\n'), pk[len(pk)/2:]...)
				if _, err := AppendPartitionKey(nil, broken, true); err == nil {
					t.Fatalf("AppendPartitionKey(%q, b64) accepted a line break", broken)
				}
			}
		}
		got, err := AppendPartitionKey([]byte("prefix"), raw, false)
		if err != nil || string(got) != "prefix"+string(appendJavaUTF8(nil, raw)) {
			t.Fatalf("AppendPartitionKey(%q) = %q, %v", raw, got, err)
		}
	})
}
