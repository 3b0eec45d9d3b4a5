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
    /// `SaveStringBuffer` (its bytes, as the module reads them back, however
    /// the server wrote them).
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

/// An RDB string: raw (a length, then the bytes), an integer written as
/// one (`0xc0..=0xc2`, read back as its decimal text), or LZF-compressed
/// (`0xc3`: compressed and plain lengths, then the data), as the server
/// writes a string above 20 bytes that compresses.
fn read_string(bytes: &[u8], pos: &mut usize) -> Option<Vec<u8>> {
    let first = *bytes.get(*pos)?;
    if first >> 6 != 3 {
        let len = read_len(bytes, pos)? as usize;
        let out = bytes.get(*pos..*pos + len)?.to_vec();
        *pos += len;
        return Some(out);
    }
    *pos += 1;
    let int_len = match first & 0x3f {
        0 => 1,
        1 => 2,
        2 => 4,
        3 => {
            let compressed = read_len(bytes, pos)? as usize;
            let plain = read_len(bytes, pos)? as usize;
            let data = bytes.get(*pos..*pos + compressed)?;
            *pos += compressed;
            let out = lzf_decompress(data)?;
            return (out.len() == plain).then_some(out);
        }
        _ => return None,
    };
    let raw = bytes.get(*pos..*pos + int_len)?;
    *pos += int_len;
    let mut le = [0u8; 8];
    le[..int_len].copy_from_slice(raw);
    let value = i64::from_le_bytes(le) << (64 - 8 * int_len) >> (64 - 8 * int_len);
    Some(value.to_string().into_bytes())
}

/// LZF (liblzf's format, which Redis uses): a control byte below 32 is a
/// run of that many plus one literal bytes; above, a back reference of
/// `(ctrl >> 5) + 2` bytes (7 taking one more length byte) at the offset
/// of its low 5 bits and the next byte, plus one.
fn lzf_decompress(data: &[u8]) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let ctrl = data[i] as usize;
        i += 1;
        if ctrl < 32 {
            out.extend_from_slice(data.get(i..i + ctrl + 1)?);
            i += ctrl + 1;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += *data.get(i)? as usize;
                i += 1;
            }
            let back = ((ctrl & 0x1f) << 8) + *data.get(i)? as usize + 1;
            i += 1;
            let start = out.len().checked_sub(back)?;
            for k in 0..len + 2 {
                out.push(out[start + k]);
            }
        }
    }
    Some(out)
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
            OPCODE_STRING => fields.push(Field::String(read_string(body, &mut pos)?)),
            _ => return None,
        }
    }
}

/// A sealed payload with the same type, module id and RDB version as
/// `payload`, holding `fields` (strings written raw, never compressed).
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
