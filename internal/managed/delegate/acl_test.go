package delegate

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
)

// raw builds posix_acl_xattr bytes with the given version and entries, so
// tests can also build malformed ones.
func raw(version uint32, entries ...Entry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.Tag)
		b = binary.LittleEndian.AppendUint16(b, e.Perm)
		b = binary.LittleEndian.AppendUint32(b, e.ID)
	}
	return b
}

var (
	userObj  = Entry{TagUserObj, 7, UndefinedID}
	groupObj = Entry{TagGroupObj, 5, UndefinedID}
	mask     = Entry{TagMask, 7, UndefinedID}
	other    = Entry{TagOther, 0, UndefinedID}
)

func TestConsumerACLEncoding(t *testing.T) {
	// The exact bytes setfacl -d -m u::rwx,g::rwx,g:1000:rwx,m::rwx,o::-
	// stores, written out by hand rather than through EncodeACL.
	want := []byte{
		0x02, 0x00, 0x00, 0x00,
		0x01, 0x00, 0x07, 0x00, 0xff, 0xff, 0xff, 0xff,
		0x04, 0x00, 0x07, 0x00, 0xff, 0xff, 0xff, 0xff,
		0x08, 0x00, 0x07, 0x00, 0xe8, 0x03, 0x00, 0x00,
		0x10, 0x00, 0x07, 0x00, 0xff, 0xff, 0xff, 0xff,
		0x20, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff,
	}
	if got := EncodeACL(ConsumerACL(1000)); !bytes.Equal(got, want) {
		t.Fatalf("EncodeACL(ConsumerACL(1000)) = % x\nwant % x", got, want)
	}
	got, err := DecodeACL(want)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ConsumerACL(1000)) {
		t.Fatalf("DecodeACL = %v, want %v", got, ConsumerACL(1000))
	}
}

func TestDecodeACL(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		ok   bool
	}{
		{"minimal", raw(2, userObj, groupObj, other), true},
		{"consumer", EncodeACL(ConsumerACL(1000)), true},
		{"mask without named entries", raw(2, userObj, groupObj, mask, other), true},
		{"named users and groups sorted", raw(2, userObj, Entry{TagUser, 6, 5}, Entry{TagUser, 4, 9}, groupObj, Entry{TagGroup, 7, 3}, mask, other), true},

		{"empty", nil, false},
		{"short header", []byte{2, 0, 0}, false},
		{"header only", raw(2), false},
		{"trailing byte", append(raw(2, userObj, groupObj, other), 0), false},
		{"version 1", raw(1, userObj, groupObj, other), false},
		{"version 3", raw(3, userObj, groupObj, other), false},
		{"missing other", raw(2, userObj, groupObj), false},
		{"missing user_obj", raw(2, groupObj, other), false},
		{"other first", raw(2, other, userObj, groupObj), false},
		{"duplicate user_obj", raw(2, userObj, userObj, groupObj, other), false},
		{"entry after other", raw(2, userObj, groupObj, other, other), false},
		{"named group without mask", raw(2, userObj, groupObj, Entry{TagGroup, 7, 3}, other), false},
		{"named user without mask", raw(2, userObj, Entry{TagUser, 7, 3}, groupObj, other), false},
		{"unsorted users", raw(2, userObj, Entry{TagUser, 7, 9}, Entry{TagUser, 7, 5}, groupObj, mask, other), false},
		{"duplicate group", raw(2, userObj, groupObj, Entry{TagGroup, 7, 3}, Entry{TagGroup, 7, 3}, mask, other), false},
		{"named group undefined id", raw(2, userObj, groupObj, Entry{TagGroup, 7, UndefinedID}, mask, other), false},
		{"user_obj with id", raw(2, Entry{TagUserObj, 7, 0}, groupObj, other), false},
		{"perm beyond rwx", raw(2, Entry{TagUserObj, 8, UndefinedID}, groupObj, other), false},
		{"unknown tag", raw(2, userObj, groupObj, Entry{0x40, 0, UndefinedID}, other), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeACL(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("DecodeACL(% x) = %v, %v; want ok=%v", tt.in, got, err, tt.ok)
			}
			if tt.ok && !bytes.Equal(EncodeACL(got), tt.in) {
				t.Fatalf("round trip: % x, want % x", EncodeACL(got), tt.in)
			}
		})
	}
}

func FuzzDecodeACL(f *testing.F) {
	f.Add(EncodeACL(ConsumerACL(1000)))
	f.Add(raw(2, userObj, groupObj, other))
	f.Add(raw(2, userObj, Entry{TagUser, 6, 5}, groupObj, Entry{TagGroup, 7, 3}, mask, other))
	f.Add(raw(1, userObj, groupObj, other))
	f.Add([]byte{2, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := DecodeACL(b)
		if err != nil {
			return
		}
		if got := EncodeACL(entries); !bytes.Equal(got, b) {
			t.Fatalf("EncodeACL(DecodeACL(% x)) = % x", b, got)
		}
	})
}
