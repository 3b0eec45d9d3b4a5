package ratelimit

import (
	"time"
)

// Calendar quotas: a QuotaSpec counts limit units per day, ISO week (from
// Monday), month or year in a time zone. A Limiter checks the zone twice
// before anything is sent: against the contract's grammar (ValidZone: UTC or
// Z, a fixed offset +HH:MM / -HH:MM up to 18:00, or an IANA name) and, for a
// name, against the time zone database in any case as the server reads it
// ("europe/paris" is Europe/Paris), so that a name
// neither knows is an *InvalidArgumentError{Arg: "zone"} when the rule is
// built rather than the server's error at every request. The local level and
// the local-only fallback count a quota in its zone too (the period ends at
// the zone's midnight, DST included: PeriodEnd).

// checkZone checks a quota's zone: the contract's grammar, then, for a
// name, the time zone database (any case, as the server: knownZone).
func checkZone(zone string) error {
	if zoneIsUTC(zone) {
		return nil
	}
	if err := ValidZone(zone); err != nil {
		return err
	}
	if _, isOffset, _ := fixedOffset(zone); isOffset {
		return nil
	}
	if !knownZone(zone) {
		return &InvalidArgumentError{Arg: "zone", Reason: zoneHelp + ", not " + quoteZone(zone) + " (not in the time zone database)"}
	}
	return nil
}

// QuotaPeriodEnd is the end of the calendar period that contains now, in
// zone: the next midnight (PeriodDay), Monday's (PeriodWeek), the first of
// the next month (PeriodMonth) or of January (PeriodYear) there, as the
// server counts it. An invalid or unknown zone is an *InvalidArgumentError
// naming zone.
func QuotaPeriodEnd(period Period, zone string, now time.Time) (time.Time, error) {
	if err := checkZone(zone); err != nil {
		return time.Time{}, err
	}
	if period < PeriodDay || period > PeriodYear {
		return time.Time{}, &InvalidArgumentError{Rule: "RL.QUOTA", Arg: "period", Reason: "the period is 0 to 3 (DAY, WEEK, MONTH, YEAR)"}
	}
	end, _ := PeriodEnd(period, zone, now.UnixMicro())
	return time.UnixMicro(end), nil
}
