package ratelimit

// Time zones of calendar quotas: the contract's zone grammar (ValidZone) and
// where a period (day, ISO week, month, year) ends in a zone, for the
// in-process quota. UTC and fixed offsets are pure calendar arithmetic; an
// IANA name is read once through time.LoadLocation (the system's zoneinfo,
// or Go's embedded copy when the program imports time/tzdata) and cached;
// a name in another case than the database's ("europe/paris", which the
// server takes) is found through the database's directory.

import (
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"
)

// maxZoneLen is the longest zone name the module takes, in bytes.
const maxZoneLen = 64

// maxOffsetS is the widest fixed offset, +/-18:00, in seconds.
const maxOffsetS = 18 * 3600

const zoneHelp = "TZ must be UTC, a fixed offset such as +05:30, or a time zone name such as America/New_York"

// ValidZone checks a quota's time zone as the contract's grammar says
// (contract.json "zones"): UTC or Z in any case; +HH:MM or -HH:MM from
// -18:00 to +18:00 (two-digit hours, minutes 00 to 59); or an IANA name (at
// most 64 bytes, no leading '/', no "..": a letter, then letters, digits,
// '_', '+', '-', in '/'-separated parts). It checks the syntax alone: a name
// the server's database does not know passes here and is refused by the
// server. The empty string is refused (QuotaSpec's "" means UTC: check a
// spec's zone only when it is not ""). The error is an
// *InvalidArgumentError with Arg "zone".
func ValidZone(zone string) error {
	if isUTC(zone) {
		return nil
	}
	if _, isOffset, ok := fixedOffset(zone); isOffset {
		if !ok {
			return &InvalidArgumentError{Arg: "zone", Reason: "TZ offset must be between -18:00 and +18:00, not " + quoteZone(zone)}
		}
		return nil
	}
	if !validZoneName(zone) {
		return &InvalidArgumentError{Arg: "zone", Reason: zoneHelp + ", not " + quoteZone(zone)}
	}
	return nil
}

func quoteZone(zone string) string { return string(appendJSONString(nil, zone)) }

func isUTC(zone string) bool {
	return strings.EqualFold(zone, "UTC") || strings.EqualFold(zone, "Z")
}

// fixedOffset reads +HH:MM or -HH:MM: isOffset when zone has that shape
// (six bytes, digits, minutes 00 to 59), ok when within +/-18:00; the
// offset in seconds east of UTC.
func fixedOffset(zone string) (seconds int64, isOffset, ok bool) {
	if len(zone) != 6 || (zone[0] != '+' && zone[0] != '-') || zone[3] != ':' {
		return 0, false, false
	}
	for _, i := range []int{1, 2, 4, 5} {
		if zone[i] < '0' || zone[i] > '9' {
			return 0, false, false
		}
	}
	h := int64(zone[1]-'0')*10 + int64(zone[2]-'0')
	m := int64(zone[4]-'0')*10 + int64(zone[5]-'0')
	if m > 59 {
		return 0, false, false
	}
	s := (h*60 + m) * 60
	if s > maxOffsetS {
		return 0, true, false
	}
	if zone[0] == '-' {
		s = -s
	}
	return s, true, true
}

// validZoneName: ^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$, at most 64
// bytes, without "..".
func validZoneName(name string) bool {
	if name == "" || len(name) > maxZoneLen || strings.Contains(name, "..") {
		return false
	}
	c := name[0]
	if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
		return false
	}
	partLen := 1
	for i := 1; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '+', c == '-':
			partLen++
		case c == '/':
			if partLen == 0 {
				return false
			}
			partLen = 0
		default:
			return false
		}
	}
	return partLen > 0
}

// The calendar, in days since 1970-01-01 (proleptic Gregorian; H. Hinnant's
// algorithms, as the core's quota.rs, for days from the epoch on).

const dayUs = 86_400_000_000

func civilFromDays(days uint64) (y, m, d uint64) {
	z := days + 719_468
	era := z / 146_097
	doe := z - era*146_097
	yoe := (doe - doe/1460 + doe/36_524 - doe/146_096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	d = doy - (153*mp+2)/5 + 1
	if mp < 10 {
		m = mp + 3
	} else {
		m = mp - 9
	}
	y = yoe + era*400
	if m <= 2 {
		y++
	}
	return y, m, d
}

func daysFromCivil(y, m, d uint64) uint64 {
	if m <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	var mp uint64
	if m > 2 {
		mp = m - 3
	} else {
		mp = m + 9
	}
	doy := (153*mp+2)/5 + d - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	v := era*146_097 + doe
	if v < 719_468 {
		return 0
	}
	return v - 719_468
}

// utcPeriodEnd is the end (Unix us) of the period that contains nowUs in
// UTC, at most maxTimeUs (the core's utc_period_end).
func utcPeriodEnd(p Period, nowUs uint64) uint64 {
	day := nowUs / dayUs
	var next uint64
	switch p {
	case PeriodDay:
		next = day + 1
	case PeriodWeek:
		next = day + 7 - (day+3)%7 // 1970-01-01 was a Thursday
	case PeriodMonth:
		y, m, _ := civilFromDays(day)
		if m == 12 {
			next = daysFromCivil(y+1, 1, 1)
		} else {
			next = daysFromCivil(y, m+1, 1)
		}
	default:
		y, _, _ := civilFromDays(day)
		next = daysFromCivil(y+1, 1, 1)
	}
	if next > maxTimeUs/dayUs {
		return maxTimeUs
	}
	return min(next*dayUs, maxTimeUs)
}

// zoneCache holds the locations LoadLocation found (nil: unknown name).
var zoneCache sync.Map // string -> *time.Location

func loadZone(name string) *time.Location {
	if v, ok := zoneCache.Load(name); ok {
		return v.(*time.Location)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		// The server takes a name in any case ("europe/paris"): find the
		// database's spelling.
		loc = nil
		if canon, ok := zoneNamesFold()[strings.ToLower(name)]; ok && canon != name {
			if l, err := time.LoadLocation(canon); err == nil {
				loc = l
			}
		}
	}
	zoneCache.Store(name, loc)
	return loc
}

// knownZone reports whether name (an IANA name, in any case) is in the
// time zone database PeriodEnd reads, as the server would find it.
func knownZone(name string) bool { return validZoneName(name) && loadZone(name) != nil }

// zoneNamesFold maps each zone name of the system's database, lower-cased,
// to its spelling (read once, from $ZONEINFO's directory or the usual
// places; empty when there is none).
var zoneNamesFold = sync.OnceValue(func() map[string]string {
	names := map[string]string{}
	dirs := []string{"/usr/share/zoneinfo/", "/usr/share/lib/zoneinfo/", "/usr/lib/locale/TZ/", "/etc/zoneinfo/"}
	if z := os.Getenv("ZONEINFO"); z != "" {
		dirs = append([]string{z}, dirs...)
	}
	for _, dir := range dirs {
		root := os.DirFS(dir)
		_ = fs.WalkDir(root, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || len(path) > maxZoneLen {
				return nil
			}
			if _, seen := names[strings.ToLower(path)]; !seen && validZoneName(path) {
				names[strings.ToLower(path)] = path
			}
			return nil
		})
		if len(names) > 0 {
			break
		}
	}
	return names
})

// PeriodEnd is the end of the calendar period that contains the instant
// nowUs (Unix microseconds) in zone: the first instant of the next day,
// Monday, first of the month or first of January there (midnight, or where
// the zone skips midnight the instant after the gap; in a repeated hour the
// earlier), as the server computes it. "" and UTC/Z are UTC, +HH:MM a fixed
// offset, anything else an IANA name (in any case) read through
// time.LoadLocation (cached);
// ok is false when that name is not valid or not known (the end is then
// UTC's). Beyond year 9999 (and 2^62 us) a period never ends: 2^62.
func PeriodEnd(p Period, zone string, nowUs int64) (endUs int64, ok bool) {
	now := clampTime(nowUs)
	if zone == "" || isUTC(zone) {
		return int64(utcPeriodEnd(p, now)), true
	}
	if off, isOffset, okOff := fixedOffset(zone); isOffset {
		if !okOff {
			return int64(utcPeriodEnd(p, now)), false
		}
		return int64(shiftedPeriodEnd(p, now, off*1_000_000)), true
	}
	if !validZoneName(zone) {
		return int64(utcPeriodEnd(p, now)), false
	}
	loc := loadZone(zone)
	if loc == nil {
		return int64(utcPeriodEnd(p, now)), false
	}
	return int64(zonedPeriodEnd(p, now, loc)), true
}

// shiftedPeriodEnd is the period end at a fixed offset (the Rust kit's
// local_period_end): the UTC calendar on the shifted instant, shifted back.
func shiftedPeriodEnd(p Period, now uint64, offUs int64) uint64 {
	shift := func(t uint64, by int64) uint64 {
		if by >= 0 {
			if t > maxU64-uint64(by) {
				return maxU64
			}
			return t + uint64(by)
		}
		if t < uint64(-by) {
			return 0
		}
		return t - uint64(-by)
	}
	return shift(utcPeriodEnd(p, shift(now, offUs)), -offUs)
}

// zonedPeriodEnd is the period end in an IANA zone.
func zonedPeriodEnd(p Period, now uint64, loc *time.Location) uint64 {
	const maxYear = 9999
	if now >= maxTimeUs {
		return maxTimeUs
	}
	t := time.UnixMicro(int64(now)).In(loc)
	y, m, d := t.Date()
	var ny, nm, nd int
	switch p {
	case PeriodDay:
		ny, nm, nd = normDate(y, int(m), d+1)
	case PeriodWeek:
		toMonday := 7 - (int(t.Weekday())+6)%7
		ny, nm, nd = normDate(y, int(m), d+toMonday)
	case PeriodMonth:
		ny, nm, nd = normDate(y, int(m)+1, 1)
	default:
		ny, nm, nd = y+1, 1, 1
	}
	if ny > maxYear {
		return maxTimeUs
	}
	start := startOfDay(ny, nm, nd, loc)
	if start < 0 {
		return 0
	}
	return min(uint64(start), maxTimeUs)
}

func normDate(y, m, d int) (int, int, int) {
	t := time.Date(y, time.Month(m), d, 12, 0, 0, 0, time.UTC)
	yy, mm, dd := t.Date()
	return yy, int(mm), dd
}

// startOfDay is the first instant (Unix us) of the date in loc: local
// midnight resolved as jiff's "compatible" strategy does: in a gap, the
// instant after it (midnight at the offset before the transition); in a
// fold, the earlier instant.
func startOfDay(y, m, d int, loc *time.Location) int64 {
	wall := time.Date(y, time.Month(m), d, 0, 0, 0, 0, time.UTC).Unix() // local midnight as if UTC
	// The offsets in force a little before and after: the real instant is
	// within 18 hours of wall.
	_, offBefore := time.Unix(wall-26*3600, 0).In(loc).Zone()
	_, offAfter := time.Unix(wall+26*3600, 0).In(loc).Zone()
	valid := func(off int) (int64, bool) {
		inst := wall - int64(off)
		_, o := time.Unix(inst, 0).In(loc).Zone()
		return inst, o == off
	}
	a, okA := valid(offBefore)
	b, okB := valid(offAfter)
	var s int64
	switch {
	case okA && okB:
		s = min(a, b)
	case okA:
		s = a
	case okB:
		s = b
	default: // a gap: midnight at the offset before it, after the gap
		s = a
	}
	return s * 1_000_000
}
