//! `DUMP` payloads, taken apart and sealed again, to feed `RESTORE` corrupt
//! data that still passes its checksum.
//!
//! A payload is `body | rdb_version (2 bytes LE) | crc64 (8 bytes LE)`, the
//! CRC (Redis's CRC-64/Jones, reflected) covering body and version. A module
//! value's body is `RDB_TYPE_MODULE_2 (7) | module id (RDB length) |
//! opcode value ... | EOF (0)`, where the module id holds the type name in
//! its upper 54 bits and the encoding version in its lower 10.

/// Redis's CRC-64 (Jones polynomial, reflected, init 0, no final xor).
pub fn crc64(bytes: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &byte in bytes {
        crc ^= byte as u64;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// True if the payload's trailing CRC matches its contents.
pub fn checksum_ok(payload: &[u8]) -> bool {
    let n = payload.len();
    n >= 10 && crc64(&payload[..n - 8]).to_le_bytes() == payload[n - 8..]
}

/// Rewrites the trailing CRC so the payload passes `RESTORE`'s check.
pub fn reseal(payload: &mut [u8]) {
    let n = payload.len();
    let crc = crc64(&payload[..n - 8]);
    payload[n - 8..].copy_from_slice(&crc.to_le_bytes());
}

/// The body of a payload: everything before the version and CRC.
pub fn body_len(payload: &[u8]) -> usize {
    payload.len() - 10
}

/// `RDB_TYPE_MODULE_2`, the first byte of a module value's body.
pub const RDB_TYPE_MODULE_2: u8 = 7;

/// Where the 64-bit module id of a module value sits in the payload: it is
/// written as an RDB length, `0x81` followed by 8 bytes big-endian.
pub fn module_id_range(payload: &[u8]) -> Option<std::ops::Range<usize>> {
    (payload.first() == Some(&RDB_TYPE_MODULE_2) && payload.get(1) == Some(&0x81)).then_some(2..10)
}

/// The module id of a module value's payload.
pub fn module_id(payload: &[u8]) -> Option<u64> {
    let range = module_id_range(payload)?;
    Some(u64::from_be_bytes(payload[range].try_into().unwrap()))
}

/// Replaces the encoding version (low 10 bits of the module id) and reseals.
pub fn with_encoding_version(payload: &[u8], encver: u64) -> Vec<u8> {
    let range = module_id_range(payload).expect("a module value payload");
    let id = module_id(payload).unwrap();
    let new_id = (id & !1023) | (encver & 1023);
    let mut out = payload.to_vec();
    out[range].copy_from_slice(&new_id.to_be_bytes());
    reseal(&mut out);
    out
}

/// One value a module saved with `RedisModule_Save*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// `SaveUnsigned`.
    Unsigned(u64),
    /// `SaveSigned` (kept as its raw 64 bits).
    Signed(u64),
    /// `SaveStringBuffer`.
    String(Vec<u8>),
}

const OPCODE_EOF: u64 = 0;
const OPCODE_SINT: u64 = 1;
const OPCODE_UINT: u64 = 2;
const OPCODE_STRING: u64 = 5;

fn read_len(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let first = *bytes.get(*pos)?;
    *pos += 1;
    match first >> 6 {
        0 => Some((first & 0x3f) as u64),
        1 => {
            let second = *bytes.get(*pos)?;
            *pos += 1;
            Some((((first & 0x3f) as u64) << 8) | second as u64)
        }
        2 if first == 0x80 => {
            let raw = bytes.get(*pos..*pos + 4)?;
            *pos += 4;
            Some(u32::from_be_bytes(raw.try_into().unwrap()) as u64)
        }
        2 if first == 0x81 => {
            let raw = bytes.get(*pos..*pos + 8)?;
            *pos += 8;
            Some(u64::from_be_bytes(raw.try_into().unwrap()))
        }
        _ => None,
    }
}

fn write_len(out: &mut Vec<u8>, len: u64) {
    if len < 1 << 6 {
        out.push(len as u8);
    } else if len < 1 << 14 {
        out.push(0x40 | (len >> 8) as u8);
        out.push(len as u8);
    } else if len <= u32::MAX as u64 {
        out.push(0x80);
        out.extend_from_slice(&(len as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// The values a module value's payload holds, in order; `None` if the
/// payload is not a module value made of integers and strings.
pub fn module_fields(payload: &[u8]) -> Option<Vec<Field>> {
    module_id_range(payload)?;
    let body = &payload[..body_len(payload)];
    let mut pos = 10;
    let mut fields = Vec::new();
    loop {
        match read_len(body, &mut pos)? {
            OPCODE_EOF => return (pos == body.len()).then_some(fields),
            OPCODE_UINT => fields.push(Field::Unsigned(read_len(body, &mut pos)?)),
            OPCODE_SINT => fields.push(Field::Signed(read_len(body, &mut pos)?)),
            OPCODE_STRING => {
                let len = read_len(body, &mut pos)? as usize;
                fields.push(Field::String(body.get(pos..pos + len)?.to_vec()));
                pos += len;
            }
            _ => return None,
        }
    }
}

/// A sealed payload with the same type, module id and RDB version as
/// `payload`, holding `fields`.
pub fn with_fields(payload: &[u8], fields: &[Field]) -> Vec<u8> {
    module_id_range(payload).expect("a module value payload");
    let mut out = payload[..10].to_vec();
    for field in fields {
        match field {
            Field::Unsigned(v) => {
                write_len(&mut out, OPCODE_UINT);
                write_len(&mut out, *v);
            }
            Field::Signed(v) => {
                write_len(&mut out, OPCODE_SINT);
                write_len(&mut out, *v);
            }
            Field::String(bytes) => {
                write_len(&mut out, OPCODE_STRING);
                write_len(&mut out, bytes.len() as u64);
                out.extend_from_slice(bytes);
            }
        }
    }
    write_len(&mut out, OPCODE_EOF);
    let n = payload.len();
    out.extend_from_slice(&payload[n - 10..n - 8]);
    out.extend_from_slice(&[0; 8]);
    reseal(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_matches_the_redis_test_vector() {
        // From Redis's crc64.c self-test.
        assert_eq!(crc64(b"123456789"), 0xe9c6d914c4b8d9ca);
    }

    #[test]
    fn lengths_round_trip() {
        for len in [
            0,
            63,
            64,
            16383,
            16384,
            u32::MAX as u64,
            u32::MAX as u64 + 1,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            write_len(&mut out, len);
            let mut pos = 0;
            assert_eq!(read_len(&out, &mut pos), Some(len));
            assert_eq!(pos, out.len());
        }
    }
}
