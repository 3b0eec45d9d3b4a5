//! One argument parser for every command: integers, limiter parameters and
//! the trailing options, each refused with an error that names it.
//!
//! Parsing works on byte slices, so it runs without Redis in unit tests and
//! allocates nothing unless it has an error to report.

use crate::calendar::{self, Zone};
use crate::error::Error;
use crate::ffi::Arg;
use crate::limiter::{Micros, Parameters, Request, MAX_PARAM};

/// The trailing options of a limiter call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `COST n [FORCE]` (default `COST 1`; `COST 0` peeks) or `REFUND n`.
    pub request: Request,
    /// `AT unix_us`: the master's clock, on the replication link and in the AOF.
    pub at: Option<Micros>,
    /// `BLOCK timeout_ms`: wait in the server until admitted, at most this
    /// long (0: no limit).
    pub block: Option<u64>,
    /// `TZ zone`: the time zone of a calendar quota.
    pub zone: Option<Zone>,
    /// `END unix_us`: the end of a calendar quota's period, as the master
    /// found it, on the replication link and in the AOF.
    pub end: Option<Micros>,
}

impl Options {
    /// Refuses `AT`, then `END`: the pinned time and period end that only
    /// the replication link and the AOF send (a client's call, and the calls
    /// never propagated as such, `RL.HIT` and `RL.ALL`, whose limiter calls
    /// go out instead).
    pub fn refuse_pinned(&self) -> Result<(), Error> {
        if self.at.is_some() {
            return Err(Error::ReservedForReplication("AT"));
        }
        if self.end.is_some() {
            return Err(Error::ReservedForReplication("END"));
        }
        Ok(())
    }
}

impl Options {
    /// Units the call would take (0 for a refund).
    pub fn cost(&self) -> u64 {
        self.request.cost()
    }
}

/// Latest `AT` accepted: 2^62 microseconds, year 148,000.
pub const MAX_AT_US: u64 = crate::limiter::MAX_TIME_US;

/// Parses a non-negative decimal integer in `min..=max`: digits only, no sign,
/// no spaces, nothing silently clamped.
pub fn parse_int(arg: &[u8], name: &'static str, min: u64, max: u64) -> Result<u64, Error> {
    let range = || Error::Range {
        arg: name,
        min,
        max,
    };
    // Up to 19 digits cannot overflow a u64; the 20th needs checking.
    let (fast, slow) = match arg.len() {
        1..=19 => (arg, &[][..]),
        20 => arg.split_at(19),
        _ => return Err(range()),
    };
    let mut value: u64 = 0;
    for &byte in fast {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return Err(range());
        }
        value = value * 10 + u64::from(digit);
    }
    for &byte in slow {
        let digit = byte.wrapping_sub(b'0');
        if digit > 9 {
            return Err(range());
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(digit)))
            .ok_or_else(range)?;
    }
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(range())
    }
}

/// A parameter written as one of `keywords`, in any case: its position.
/// Its number is accepted too (a call propagated from a policy's
/// parameters, which are numbers).
pub fn parse_keyword(arg: &[u8], name: &'static str, keywords: &[&str]) -> Result<u64, Error> {
    if let Some(i) = keywords
        .iter()
        .position(|k| arg.eq_ignore_ascii_case(k.as_bytes()))
    {
        return Ok(i as u64);
    }
    parse_int(arg, name, 0, keywords.len() as u64 - 1).map_err(|_| {
        Error::Syntax(format!(
            "{name} must be one of {}, not '{}'",
            keywords.join(", "),
            Error::quote(arg)
        ))
    })
}

/// `COST n [FORCE]`: the units a call takes, and whether it takes them even
/// when the limiter would deny (a penalty, leaving the limiter in debt).
pub const COST: Arg = Arg::block(
    c"cost",
    &[
        Arg::integer(c"units").summary(c"units this call takes (default 1; 0 inspects)"),
        Arg::keyword(c"force", c"FORCE")
            .optional()
            .summary(c"take the units even if the limiter would deny them"),
    ],
)
.token(c"COST");

/// `[COST n [FORCE] | REFUND n]`, the options of every limiter command and
/// of `RL.HIT`, as `COMMAND DOCS` shows them (parsed by [`parse_options`]).
pub const COST_OR_REFUND: Arg = Arg::one_of(
    c"cost-or-refund",
    &[
        COST,
        Arg::block(
            c"refund",
            &[Arg::integer(c"units").summary(c"units to give back, at most those consumed")],
        )
        .token(c"REFUND"),
    ],
)
.optional();

/// `UPTO n`: take as many units as the limiter admits now, at most `n`.
pub const UPTO: Arg = Arg::integer(c"most").token(c"UPTO").summary(
    c"take as many units as fit now, at most this many and at least 1; the reply adds granted",
);

/// `[COST n [FORCE] | REFUND n | UPTO n]`: the options of the limiters that
/// grant part of a request (every one but the leaky bucket and the
/// concurrency limiter), of `RL.HIT` and of `RL.ALL` (parsed by
/// [`parse_options`]).
pub const COST_REFUND_OR_UPTO: Arg = Arg::one_of(
    c"cost-refund-or-upto",
    &[
        COST,
        Arg::block(
            c"refund",
            &[Arg::integer(c"units").summary(c"units to give back, at most those consumed")],
        )
        .token(c"REFUND"),
        UPTO,
    ],
)
.optional();

/// `BLOCK timeout_ms`: wait in the server until admitted.
pub const BLOCK: Arg = Arg::integer(c"timeout_ms")
    .token(c"BLOCK")
    .summary(c"wait in the server until admitted, at most this long (0: no limit)")
    .optional();

/// Parses `[COST n [FORCE] | REFUND n | UPTO n] [BLOCK timeout_ms]` (and the
/// internal `[AT us]`), in any order and case, each at most once.
pub fn parse_options(rest: &[&[u8]]) -> Result<Options, Error> {
    let mut cost = None;
    let mut refund = None;
    let mut upto = None;
    let mut force = false;
    let mut at = None;
    let mut block = None;
    let mut zone = None;
    let mut end = None;
    let mut i = 0;
    while i < rest.len() {
        let name = rest[i];
        let value = rest.get(i + 1).copied();
        if name.eq_ignore_ascii_case(b"FORCE") {
            if force {
                return Err(Error::DuplicateOption("FORCE"));
            }
            force = true;
            i += 1;
            continue;
        }
        if name.eq_ignore_ascii_case(b"COST") {
            let value = value.ok_or(Error::MissingValue("COST"))?;
            if cost.is_some() {
                return Err(Error::DuplicateOption("COST"));
            }
            cost = Some(parse_int(value, "COST", 0, MAX_PARAM)?);
        } else if name.eq_ignore_ascii_case(b"REFUND") {
            let value = value.ok_or(Error::MissingValue("REFUND"))?;
            if refund.is_some() {
                return Err(Error::DuplicateOption("REFUND"));
            }
            refund = Some(parse_int(value, "REFUND", 0, MAX_PARAM)?);
        } else if name.eq_ignore_ascii_case(b"UPTO") {
            let value = value.ok_or(Error::MissingValue("UPTO"))?;
            if upto.is_some() {
                return Err(Error::DuplicateOption("UPTO"));
            }
            upto = Some(parse_int(value, "UPTO", 1, MAX_PARAM)?);
        } else if name.eq_ignore_ascii_case(b"BLOCK") {
            let value = value.ok_or(Error::MissingValue("BLOCK"))?;
            if block.is_some() {
                return Err(Error::DuplicateOption("BLOCK"));
            }
            block = Some(parse_int(value, "BLOCK", 0, MAX_PARAM)?);
        } else if name.eq_ignore_ascii_case(b"TZ") {
            let value = value.ok_or(Error::MissingValue("TZ"))?;
            if zone.is_some() {
                return Err(Error::DuplicateOption("TZ"));
            }
            zone = Some(calendar::zone(value).map_err(|bad| Error::Syntax(bad.message(value)))?);
        } else if name.eq_ignore_ascii_case(b"END") {
            let value = value.ok_or(Error::MissingValue("END"))?;
            if end.is_some() {
                return Err(Error::DuplicateOption("END"));
            }
            end = Some(Micros::from_us(parse_int(value, "END", 0, MAX_AT_US)?));
        } else if name.eq_ignore_ascii_case(b"AT") {
            let value = value.ok_or(Error::MissingValue("AT"))?;
            if at.is_some() {
                return Err(Error::DuplicateOption("AT"));
            }
            at = Some(Micros::from_us(parse_int(value, "AT", 0, MAX_AT_US)?));
        } else {
            return Err(Error::UnknownOption(Error::quote(name)));
        }
        i += 2;
    }
    if let Some(most) = upto {
        let other = if cost.is_some() {
            Some("COST")
        } else if force {
            Some("FORCE")
        } else if refund.is_some() {
            Some("REFUND")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(Error::Exclusive("UPTO", other));
        }
        return Ok(Options {
            request: Request::UpTo(most),
            at,
            block,
            zone,
            end,
        });
    }
    let request = match (refund, force) {
        (Some(_), _) if cost.is_some() => return Err(Error::Exclusive("REFUND", "COST")),
        (Some(_), true) => return Err(Error::Exclusive("REFUND", "FORCE")),
        (Some(units), false) => Request::Refund(units),
        (None, true) => Request::Force(cost.unwrap_or(1)),
        (None, false) => Request::Cost(cost.unwrap_or(1)),
    };
    Ok(Options {
        request,
        at,
        block,
        zone,
        end,
    })
}

/// The parameters of one algorithm, as they follow the key.
///
/// Each word is read as an integer in the range the core lists for it
/// ([`Parameters::INTEGERS`]), in order, so that an error names the first
/// bad word even when it is no integer at all; the constructor then checks
/// everything again, with the rules between parameters, and is what makes
/// them valid. One impl serves every algorithm.
pub trait Params: Sized {
    /// How many integer parameters follow the key.
    const COUNT: usize;
    fn parse(args: &[&[u8]]) -> Result<Self, Error>;
    /// The parameters in command order, as `parse` reads them back.
    fn values(&self) -> ParamList;
}

impl<P: Parameters> Params for P {
    const COUNT: usize = {
        assert!(
            P::INTEGERS.len() <= MAX_PARAMS,
            "a ParamList holds every parameter list"
        );
        P::INTEGERS.len()
    };

    #[inline]
    fn parse(args: &[&[u8]]) -> Result<Self, Error> {
        let mut values = [0; MAX_PARAMS];
        for (i, int) in P::INTEGERS.iter().enumerate() {
            values[i] = if int.keywords.is_empty() {
                parse_int(args[i], int.name, int.min, int.max)?
            } else {
                parse_keyword(args[i], int.name, int.keywords)?
            };
        }
        Ok(P::from_integers(&values[..Self::COUNT])?)
    }

    #[inline]
    fn values(&self) -> ParamList {
        let mut list = ParamList {
            values: [0; MAX_PARAMS],
            len: 0,
        };
        self.to_integers(&mut |value| {
            list.values[list.len] = value;
            list.len += 1;
        });
        list
    }
}

/// Most parameters an algorithm takes.
const MAX_PARAMS: usize = 3;

/// A limiter's parameters in command order (at most three; no allocation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamList {
    values: [u64; MAX_PARAMS],
    len: usize,
}

impl ParamList {
    pub fn as_slice(&self) -> &[u64] {
        &self.values[..self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u64] {
        &mut self.values[..self.len]
    }
}

/// A limiter call after its key: parameters, then options.
pub fn parse_call<P: Params>(args: &[&[u8]]) -> Result<(P, Options), Error> {
    if args.len() < P::COUNT {
        return Err(Error::Arity);
    }
    let params = P::parse(&args[..P::COUNT])?;
    let options = parse_options(&args[P::COUNT..])?;
    Ok((params, options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::words;
    use crate::limiter::fixed_window::FixedWindowParams;
    use crate::limiter::hash_window::HashWindowParams;
    use crate::limiter::leaky_bucket::LeakyBucketParams;
    use crate::limiter::sliding_log::{self, SlidingLogParams};
    use crate::limiter::token_bucket::TokenBucketParams;
    use proptest::prelude::*;

    #[test]
    fn integers_are_plain_decimal_digits_in_range() {
        assert_eq!(parse_int(b"42", "x", 1, 100), Ok(42));
        assert_eq!(parse_int(b"0", "COST", 0, 5), Ok(0));
        for bad in [
            &b""[..],
            b"-1",
            b"+1",
            b" 1",
            b"1 ",
            b"1.0",
            b"1e3",
            b"0x10",
            b"abc",
            b"18446744073709551616",
            b"99999999999999999999999",
        ] {
            assert_eq!(
                parse_int(bad, "capacity", 1, MAX_PARAM),
                Err(Error::param("capacity")),
                "{bad:?}"
            );
        }
        assert!(parse_int(b"0", "capacity", 1, 10).is_err());
        assert!(parse_int(b"1099511627777", "capacity", 1, MAX_PARAM).is_err());
        assert_eq!(
            parse_int(b"1099511627776", "c", 1, MAX_PARAM),
            Ok(MAX_PARAM)
        );
    }

    #[test]
    fn options_default_to_cost_one_and_no_pinned_time() {
        assert_eq!(
            parse_options(&[]),
            Ok(Options {
                request: Request::Cost(1),
                at: None,
                block: None,
                zone: None,
                end: None,
            })
        );
        let o = parse_options(&[b"cost", b"0", b"At", b"17"]).unwrap();
        assert_eq!(
            o,
            Options {
                request: Request::Cost(0),
                at: Some(Micros::from_us(17)),
                block: None,
                zone: None,
                end: None,
            }
        );
    }

    #[test]
    fn force_goes_with_cost_and_refund_alone_in_any_order_and_case() {
        let request = |words: &[&[u8]]| parse_options(words).map(|o| o.request);
        assert_eq!(request(&[b"COST", b"3", b"FORCE"]), Ok(Request::Force(3)));
        assert_eq!(request(&[b"force", b"Cost", b"3"]), Ok(Request::Force(3)));
        assert_eq!(request(&[b"FORCE"]), Ok(Request::Force(1)));
        assert_eq!(request(&[b"refund", b"2"]), Ok(Request::Refund(2)));
        assert_eq!(
            request(&[b"REFUND", b"2", b"AT", b"5"]),
            Ok(Request::Refund(2))
        );
        assert_eq!(
            request(&[b"REFUND", b"1", b"COST", b"1"]),
            Err(Error::Exclusive("REFUND", "COST"))
        );
        assert_eq!(
            request(&[b"COST", b"1", b"REFUND", b"1"]),
            Err(Error::Exclusive("REFUND", "COST"))
        );
        assert_eq!(
            request(&[b"REFUND", b"1", b"FORCE"]),
            Err(Error::Exclusive("REFUND", "FORCE"))
        );
        assert_eq!(
            request(&[b"FORCE", b"COST", b"1", b"FORCE"]),
            Err(Error::DuplicateOption("FORCE"))
        );
        assert_eq!(request(&[b"REFUND"]), Err(Error::MissingValue("REFUND")));
        for bad in [&b"-1"[..], b"1.5", b"x", b"1099511627777"] {
            assert!(
                matches!(
                    request(&[b"REFUND", bad]),
                    Err(Error::Range { arg: "REFUND", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn block_takes_a_timeout_once_in_any_case() {
        let block = |words: &[&[u8]]| parse_options(words).map(|o| o.block);
        assert_eq!(block(&[]), Ok(None));
        assert_eq!(block(&[b"BLOCK", b"250"]), Ok(Some(250)));
        assert_eq!(block(&[b"cost", b"2", b"block", b"0"]), Ok(Some(0)));
        assert_eq!(block(&[b"BLOCK"]), Err(Error::MissingValue("BLOCK")));
        assert_eq!(
            block(&[b"BLOCK", b"1", b"BLOCK", b"2"]),
            Err(Error::DuplicateOption("BLOCK"))
        );
        for bad in [&b"-1"[..], b"1.5", b"soon", b"1099511627777"] {
            assert!(
                matches!(
                    block(&[b"BLOCK", bad]),
                    Err(Error::Range { arg: "BLOCK", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn bad_options_are_named() {
        assert_eq!(parse_options(&[b"COST"]), Err(Error::MissingValue("COST")));
        assert_eq!(
            parse_options(&[b"COST", b"1", b"cost", b"2"]),
            Err(Error::DuplicateOption("COST"))
        );
        assert_eq!(
            parse_options(&[b"COSTS", b"1"]),
            Err(Error::UnknownOption("COSTS".into()))
        );
        assert!(matches!(
            parse_options(&[b"COST", b"-1"]),
            Err(Error::Range { arg: "COST", .. })
        ));
    }

    #[test]
    fn token_bucket_parameters_are_named_in_errors() {
        let e = |a: [&[u8]; 3]| parse_call::<TokenBucketParams>(&a).unwrap_err();
        assert_eq!(e([b"0", b"1", b"1"]), Error::param("capacity"));
        assert_eq!(e([b"1", b"x", b"1"]), Error::param("refill_count"));
        assert_eq!(e([b"1", b"1", b""]), Error::param("refill_ms"));
        // 2^40 tokens at one per 2^40 ms would take 2^80 ms to fill
        assert!(matches!(
            e([b"1099511627776", b"1", b"1099511627776"]),
            Error::SpanTooLong { .. }
        ));
    }

    #[test]
    fn fixed_window_parameters_are_named_in_errors() {
        let e = |a: [&[u8]; 2]| parse_call::<FixedWindowParams>(&a).unwrap_err();
        assert_eq!(e([b"0", b"1"]), Error::param("limit"));
        assert_eq!(e([b"1", b"-5"]), Error::param("window_ms"));
        assert_eq!(
            parse_call::<FixedWindowParams>(&[b"1"]).unwrap_err(),
            Error::Arity
        );
    }

    #[test]
    fn hash_window_buckets_must_divide_the_window() {
        let e = |a: [&[u8]; 3]| parse_call::<HashWindowParams>(&a).unwrap_err();
        assert_eq!(e([b"10", b"1000", b"300"]), Error::BucketDoesNotDivide);
        assert_eq!(e([b"10", b"0", b"1"]), Error::param("window_ms"));
        assert_eq!(e([b"10", b"1000", b"0"]), Error::param("bucket_ms"));
        assert!(matches!(e([b"10", b"2000000", b"1"]), Error::Range { .. }));
        let (p, _) = parse_call::<HashWindowParams>(&[b"10", b"60000", b"1000"]).unwrap();
        assert_eq!(p.buckets(), 60);
    }

    #[test]
    fn sliding_and_leaky_parameters_are_named_in_errors() {
        let e = parse_call::<SlidingLogParams>(&[b"16777216", b"1000"]).unwrap_err();
        assert_eq!(
            e,
            Error::Range {
                arg: "limit",
                min: 1,
                max: sliding_log::MAX_LIMIT
            }
        );
        let e = parse_call::<LeakyBucketParams>(&[b"5", b"0", b"1000"]).unwrap_err();
        assert_eq!(e, Error::param("leak_count"));
        let e = parse_call::<LeakyBucketParams>(&[b"5", b"1", b"x"]).unwrap_err();
        assert_eq!(e, Error::param("leak_ms"));
    }

    #[test]
    fn a_call_needs_the_required_words_only() {
        let args = [
            Arg::key(c"key"),
            Arg::integer(c"limit"),
            Arg::integer(c"window_ms"),
            COST_OR_REFUND,
        ];
        assert_eq!(words(&args), (3, Some(6)), "up to COST n FORCE");
    }

    #[test]
    fn a_present_option_counts_its_token_and_its_members() {
        assert_eq!(COST.words(), (2, Some(3)), "COST n [FORCE]");
        assert_eq!(
            COST_OR_REFUND.words(),
            (2, Some(3)),
            "REFUND n or COST n [FORCE]"
        );
        assert_eq!(Arg::keyword(c"force", c"FORCE").words(), (1, Some(1)));
    }

    proptest! {
        #[test]
        fn any_u64_in_range_round_trips(v in 0u64..=u64::MAX) {
            let text = v.to_string();
            prop_assert_eq!(parse_int(text.as_bytes(), "x", 0, u64::MAX), Ok(v));
        }

        #[test]
        fn arbitrary_bytes_never_panic(args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..8)) {
            let slices: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let _ = parse_call::<TokenBucketParams>(&slices);
            let _ = parse_call::<FixedWindowParams>(&slices);
            let _ = parse_call::<LeakyBucketParams>(&slices);
            let _ = parse_call::<SlidingLogParams>(&slices);
            let _ = parse_call::<HashWindowParams>(&slices);
        }
    }
}
