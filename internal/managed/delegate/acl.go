package delegate

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Entry is one POSIX ACL entry as stored in the posix_acl_xattr format.
type Entry struct {
	Tag  uint16
	Perm uint16 // rwx bits: 4 read, 2 write, 1 execute
	ID   uint32 // uid or gid for TagUser/TagGroup, UndefinedID otherwise
}

// ACL entry tags (linux/posix_acl.h).
const (
	TagUserObj  uint16 = 0x01
	TagUser     uint16 = 0x02
	TagGroupObj uint16 = 0x04
	TagGroup    uint16 = 0x08
	TagMask     uint16 = 0x10
	TagOther    uint16 = 0x20
)

// UndefinedID is the id stored for entries that name no user or group.
const UndefinedID uint32 = 0xFFFFFFFF

const (
	aclVersion      = 2
	aclHeaderSize   = 4
	aclEntrySize    = 8
	xattrDefaultACL = "system.posix_acl_default"
	permRWX         = 7
)

// ConsumerACL is the default ACL Tree puts on every directory: owner and
// the consumer group get rwx, others nothing. The mask is rwx so it never
// narrows the group entries of what is created below.
func ConsumerACL(gid int) []Entry {
	return []Entry{
		{TagUserObj, permRWX, UndefinedID},
		{TagGroupObj, permRWX, UndefinedID},
		{TagGroup, permRWX, uint32(gid)},
		{TagMask, permRWX, UndefinedID},
		{TagOther, 0, UndefinedID},
	}
}

// EncodeACL returns the posix_acl_xattr bytes for entries, which must
// already be in canonical order (DecodeACL accepts only that order).
func EncodeACL(entries []Entry) []byte {
	b := make([]byte, aclHeaderSize, aclHeaderSize+aclEntrySize*len(entries))
	binary.LittleEndian.PutUint32(b, aclVersion)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.Tag)
		b = binary.LittleEndian.AppendUint16(b, e.Perm)
		b = binary.LittleEndian.AppendUint32(b, e.ID)
	}
	return b
}

// DecodeACL parses posix_acl_xattr bytes and accepts only a valid ACL in
// the canonical form the kernel itself returns: the entries the kernel's
// posix_acl_valid requires, in tag order, user and group entries sorted by
// id without duplicates, and UndefinedID on the entries that name nobody.
// So EncodeACL(DecodeACL(b)) == b for every accepted b.
func DecodeACL(b []byte) ([]Entry, error) {
	if len(b) < aclHeaderSize || (len(b)-aclHeaderSize)%aclEntrySize != 0 {
		return nil, fmt.Errorf("acl: bad length %d", len(b))
	}
	if v := binary.LittleEndian.Uint32(b); v != aclVersion {
		return nil, fmt.Errorf("acl: unsupported version %d", v)
	}
	entries := make([]Entry, 0, (len(b)-aclHeaderSize)/aclEntrySize)
	for p := b[aclHeaderSize:]; len(p) > 0; p = p[aclEntrySize:] {
		entries = append(entries, Entry{
			Tag:  binary.LittleEndian.Uint16(p),
			Perm: binary.LittleEndian.Uint16(p[2:]),
			ID:   binary.LittleEndian.Uint32(p[4:]),
		})
	}
	if err := validate(entries); err != nil {
		return nil, err
	}
	return entries, nil
}

// validate mirrors the kernel's posix_acl_valid state machine and adds the
// canonical-form checks on ids.
func validate(entries []Entry) error {
	const (
		wantUserObj = iota
		inUsers
		inGroups
		wantOther
		complete
	)
	state, needMask := wantUserObj, false
	for i, e := range entries {
		if e.Perm&^permRWX != 0 {
			return fmt.Errorf("acl: entry %d: bad permissions %#x", i, e.Perm)
		}
		named := e.Tag == TagUser || e.Tag == TagGroup
		switch {
		case named && e.ID == UndefinedID:
			return fmt.Errorf("acl: entry %d: named entry without an id", i)
		case !named && e.ID != UndefinedID:
			return fmt.Errorf("acl: entry %d: unexpected id %d", i, e.ID)
		case named && i > 0 && entries[i-1].Tag == e.Tag && entries[i-1].ID >= e.ID:
			return fmt.Errorf("acl: entry %d: ids not sorted or duplicated", i)
		}
		ok := false
		switch e.Tag {
		case TagUserObj:
			ok, state = state == wantUserObj, inUsers
		case TagUser:
			ok, needMask = state == inUsers, true
		case TagGroupObj:
			ok, state = state == inUsers, inGroups
		case TagGroup:
			ok, needMask = state == inGroups, true
		case TagMask:
			ok, state = state == inGroups, wantOther
		case TagOther:
			ok, state = state == wantOther || (state == inGroups && !needMask), complete
		default:
			return fmt.Errorf("acl: entry %d: unknown tag %#x", i, e.Tag)
		}
		if !ok {
			return fmt.Errorf("acl: entry %d: tag %#x out of order", i, e.Tag)
		}
	}
	if state != complete {
		return errors.New("acl: incomplete (needs user, group and other entries, and a mask with named entries)")
	}
	return nil
}

// DefaultACL reads and decodes the default ACL of the directory open as
// dirFd (a regular descriptor: the kernel refuses xattr calls on O_PATH).
// A directory without a default ACL yields nil entries and no error.
func DefaultACL(dirFd int) ([]Entry, error) {
	for {
		n, err := unix.Fgetxattr(dirFd, xattrDefaultACL, nil)
		if err == nil {
			buf := make([]byte, n)
			n, err = unix.Fgetxattr(dirFd, xattrDefaultACL, buf)
			if err == nil {
				return DecodeACL(buf[:n])
			}
		}
		switch {
		case errors.Is(err, unix.ERANGE):
			continue // grew between the two calls
		case errors.Is(err, unix.ENODATA):
			return nil, nil
		case errors.Is(err, unix.EOPNOTSUPP):
			return nil, ErrNoACLSupport
		}
		return nil, fmt.Errorf("acl: read default ACL: %w", err)
	}
}
