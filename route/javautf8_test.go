package route

import (
	"bufio"
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
		if got := javaUTF8(string(inB)); string(got) != string(wantB) {
			t.Errorf("javaUTF8(%x) = %x, the JDK gives %x", inB, got, wantB)
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
		got := javaUTF8(s)
		if !utf8.Valid(got) {
			t.Fatalf("javaUTF8(%q) = %q is not valid UTF-8", s, got)
		}
		if utf8.ValidString(s) && string(got) != s {
			t.Fatalf("javaUTF8 changed valid input %q to %q", s, got)
		}
		if len(got) > 3*len(s) {
			t.Fatalf("javaUTF8(%q) grew to %d bytes", s, len(got))
		}
	})
}

// FuzzAppendPartitionKey checks the allocation-free path the engine uses against MessageKey:
// the same bytes, or the same refusal of bad base64, for any partition key.
func FuzzAppendPartitionKey(f *testing.F) {
	for _, s := range []string{"", "k", "\xff\xe2\x82", "AAEC/w==", "AAEC/w", "AAEC/w=", "AA\nEC", "!!"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, pk []byte, b64 bool) {
		got, err := AppendPartitionKey([]byte("prefix"), pk, b64)
		want, ok, wantErr := MessageKey(KeyFields{PartitionKey: string(pk), HasPartitionKey: true, PartitionKeyB64: b64})
		if (err != nil) != (wantErr != nil) || (wantErr == nil && (!ok || string(got) != "prefix"+string(want))) {
			t.Fatalf("AppendPartitionKey(%q, b64=%v) = %q, %v; MessageKey gives %q, %v", pk, b64, got, err, want, wantErr)
		}
	})
}
