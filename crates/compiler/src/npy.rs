//! `.npy` (NumPy) tensors in: a strict, bounded reader of the format's header and data.
//!
//! The header is read only up to numpy's own 10,000 bytes and within the file, and its
//! dictionary parsed in one pass without recursion (the `npyz` crate's parser is exponential
//! in bracket nesting: a 128-byte file took 15 s, and it allocated a declared 4-GiB header
//! before failing). The element count is checked against the compiler's budget and the data
//! against the file's size before anything is allocated (fallibly). Fuzzed by
//! `fuzz/npy_read`.

use crate::tensor::HostTensor;
use nrt_hal::DType;
use std::io::Read;
use std::path::Path;

type Res<T> = std::result::Result<T, String>;

/// The largest `.npy` header read (numpy's own `max_header_size`).
pub const MAX_HEADER_BYTES: usize = 10_000;

/// The most bytes a tensor's values take on the host: the compiler's budget for one tensor.
const MAX_INPUT_BYTES: usize = crate::tensor::MAX_TENSOR_BYTES;

/// A parsed `.npy` header.
#[derive(Debug, PartialEq, Eq)]
pub struct Header {
    /// Element type.
    pub dtype: DType,
    /// Whether the file stores it big-endian.
    pub big_endian: bool,
    /// Shape.
    pub shape: Vec<usize>,
    /// Offset of the data.
    pub data_offset: usize,
}

/// Parses the preamble and header of a `.npy` file from its first bytes (`prefix`: at least
/// the header; `file_len`: the whole file's length). Strict and bounded: the header is at
/// most [`MAX_HEADER_BYTES`] and within the file, the dictionary is parsed in one pass
/// without recursion (the `npyz` crate's parser is exponential in bracket nesting: a
/// 128-byte file took 15 s), and only C-order plain arrays of the element types below are
/// accepted.
pub fn parse_header(prefix: &[u8], file_len: u64) -> Res<Header> {
    if prefix.len() < 10 || &prefix[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (len, start) = match prefix[6] {
        1 => (u16::from_le_bytes([prefix[8], prefix[9]]) as usize, 10),
        2 | 3 if prefix.len() >= 12 => (
            u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]) as usize,
            12,
        ),
        v => return Err(format!("format version {v} is not supported (1 to 3)")),
    };
    if len > MAX_HEADER_BYTES {
        return Err(format!(
            "a header of {len} bytes (numpy reads at most {MAX_HEADER_BYTES})"
        ));
    }
    let end = start + len;
    if end as u64 > file_len || end > prefix.len() {
        return Err(format!(
            "the header claims {len} bytes, past the end of the {file_len}-byte file"
        ));
    }
    let text = std::str::from_utf8(&prefix[start..end])
        .map_err(|_| "the header is not text".to_owned())?;
    let dict = parse_dict(text)?;
    let descr = dict.descr.ok_or("the header has no 'descr'")?;
    let shape = dict.shape.ok_or("the header has no 'shape'")?;
    if dict
        .fortran_order
        .ok_or("the header has no 'fortran_order'")?
    {
        return Err("Fortran-order arrays are not supported".into());
    }
    let (big_endian, dtype) = dtype_of(&descr)?;
    Ok(Header {
        dtype,
        big_endian,
        shape,
        data_offset: end,
    })
}

#[derive(Default)]
struct Dict {
    descr: Option<String>,
    fortran_order: Option<bool>,
    shape: Option<Vec<usize>>,
}

/// The header's dictionary: `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`.
fn parse_dict(t: &str) -> Res<Dict> {
    let mut p = Lexer {
        s: t.as_bytes(),
        i: 0,
    };
    let mut d = Dict::default();
    p.expect(b'{')?;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string()?;
        p.expect(b':')?;
        match key.as_str() {
            "descr" => {
                p.skip_ws();
                if p.peek() == Some(b'[') {
                    return Err("structured arrays are not supported".into());
                }
                d.descr = Some(p.string()?);
            }
            "fortran_order" => d.fortran_order = Some(p.boolean()?),
            "shape" => d.shape = Some(p.tuple()?),
            other => return Err(format!("unexpected key {other:?} in the header")),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.i != p.s.len() {
        return Err("text after the header's dictionary".into());
    }
    Ok(d)
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> Res<()> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!(
                "the header is malformed at byte {}: expected '{}'",
                self.i, c as char
            ))
        }
    }
    fn string(&mut self) -> Res<String> {
        self.skip_ws();
        let q = self.peek().filter(|&c| c == b'\'' || c == b'"');
        let q = q.ok_or_else(|| {
            format!(
                "the header is malformed at byte {}: expected a string",
                self.i
            )
        })?;
        self.i += 1;
        let from = self.i;
        while self.i < self.s.len() && self.s[self.i] != q {
            self.i += 1;
        }
        if self.i == self.s.len() {
            return Err("the header has an unterminated string".into());
        }
        let v = String::from_utf8_lossy(&self.s[from..self.i]).into_owned();
        self.i += 1;
        Ok(v)
    }
    fn boolean(&mut self) -> Res<bool> {
        self.skip_ws();
        for (w, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if self.s[self.i..].starts_with(w) {
                self.i += w.len();
                return Ok(v);
            }
        }
        Err("fortran_order is not True or False".into())
    }
    fn tuple(&mut self) -> Res<Vec<usize>> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(b')') {
                return Ok(dims);
            }
            self.skip_ws();
            let from = self.i;
            while self.i < self.s.len() && self.s[self.i].is_ascii_digit() {
                self.i += 1;
            }
            if from == self.i {
                return Err("the shape is not a tuple of non-negative integers".into());
            }
            let text = std::str::from_utf8(&self.s[from..self.i]).unwrap_or("");
            let d: usize = text
                .parse()
                .map_err(|_| format!("dimension {text} is too large"))?;
            if dims.len() >= 64 {
                return Err("the shape has more than 64 dimensions".into());
            }
            dims.push(d);
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

/// The element type of a `descr` such as `<f4`, `|b1`, `>i8`.
fn dtype_of(descr: &str) -> Res<(bool, DType)> {
    let unsupported = || {
        format!(
            "element type {descr:?} is not supported (float16/32/64, int8..64, uint8..64, bool)"
        )
    };
    let (order, code) = match descr.as_bytes().first() {
        Some(b'<' | b'>' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
        _ => (b'|', descr),
    };
    let dtype = match code {
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i1" => DType::I8,
        "u1" => DType::U8,
        "b1" => DType::Bool,
        "i2" => DType::I16,
        "u2" => DType::U16,
        "i4" => DType::I32,
        "u4" => DType::U32,
        "i8" => DType::I64,
        "u8" => DType::U64,
        _ => return Err(unsupported()),
    };
    Ok((order == b'>' && dtype.size() > 1, dtype))
}

/// Reads a C-order `.npy` file (its header through [`parse_header`]; the data must be
/// exactly what the header's shape needs). Errors name the file.
pub fn read(path: &Path) -> Res<HostTensor> {
    let what = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("{what}: {e}"))?;
    let len = f.metadata().map_err(|e| format!("{what}: {e}"))?.len();
    read_from(std::io::BufReader::new(f), len).map_err(|e| format!("{what}: {e}"))
}

/// [`read`] of `len` bytes from `r` (a file's contents; errors without the file's name).
pub fn read_from(mut r: impl Read, file_len: u64) -> Res<HostTensor> {
    let mut prefix = Vec::new();
    (&mut r)
        .take((MAX_HEADER_BYTES + 12) as u64)
        .read_to_end(&mut prefix)
        .map_err(|e| e.to_string())?;
    let h = parse_header(&prefix, file_len).map_err(|e| e.to_string())?;
    // Held as 64-bit values on the host: at most the compiler's budget for one tensor.
    let n = h
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|n| n.checked_mul(8).is_some_and(|b| b <= MAX_INPUT_BYTES))
        .ok_or_else(|| {
            format!(
                "shape {:?} is larger than an input may be ({MAX_INPUT_BYTES} bytes as 64-bit values)",
                h.shape
            )
        })?;
    let bytes_len = n * h.dtype.size();
    let have = file_len - h.data_offset as u64;
    if have != bytes_len as u64 {
        return Err(format!(
            "shape {:?} of {} needs {bytes_len} bytes of data, the file has {have}",
            h.shape, h.dtype
        ));
    }
    let mut data = Vec::new();
    data.try_reserve_exact(bytes_len)
        .map_err(|_| format!("out of memory for {bytes_len} bytes"))?;
    data.extend_from_slice(&prefix[h.data_offset.min(prefix.len())..]);
    r.take((bytes_len - data.len().min(bytes_len)) as u64)
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    data.truncate(bytes_len);
    if data.len() != bytes_len {
        return Err("the file shrank while read".into());
    }
    if h.big_endian {
        for c in data.chunks_exact_mut(h.dtype.size()) {
            c.reverse();
        }
    }
    if h.dtype == DType::Bool {
        for b in &mut data {
            *b = (*b != 0) as u8;
        }
    }
    HostTensor::from_bytes(h.dtype, h.shape, &data).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str) -> Vec<u8> {
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((header.len() as u16).to_le_bytes());
        b.extend(header.as_bytes());
        b
    }

    #[test]
    fn headers_parse_strictly_and_in_bounded_time() {
        let h = parse_header(
            &npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"),
            1 << 20,
        )
        .unwrap();
        assert_eq!(
            (h.dtype, h.shape.clone(), h.big_endian),
            (DType::F32, vec![2, 3], false)
        );
        let b = parse_header(
            &npy("{'descr': '|b1', 'fortran_order': False, 'shape': ()}"),
            99,
        );
        assert_eq!(b.unwrap().dtype, DType::Bool);
        let be = parse_header(
            &npy("{'descr': '>i8', 'fortran_order': False, 'shape': (4,)}"),
            99,
        );
        assert!(be.unwrap().big_endian);
        // Deep nesting (exponential in npyz): refused at once.
        let deep = format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': {}}}",
            "(".repeat(100)
        );
        let t = std::time::Instant::now();
        assert!(parse_header(&npy(&deep), 1 << 20).is_err());
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // A 0xffffffff-byte header in a 13-byte file: refused before anything is allocated.
        let mut big = b"\x93NUMPY\x02\x00".to_vec();
        big.extend(u32::MAX.to_le_bytes());
        big.push(b'{');
        let e = parse_header(&big, 13).unwrap_err();
        assert!(e.contains("numpy reads at most"), "{e}");
        let mut past = b"\x93NUMPY\x01\x00".to_vec();
        past.extend(500u16.to_le_bytes());
        let e = parse_header(&past, 20).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
        for (hdr, why) in [
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,)}",
                "structured",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
                "not supported",
            ),
            (
                "{'descr': '|O', 'fortran_order': False, 'shape': (1,)}",
                "not supported",
            ),
            (
                "{'descr': '<f4', 'fortran_order': True, 'shape': (1,)}",
                "Fortran",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
                "non-negative",
            ),
            ("{'descr': '<f4', 'fortran_order': False}", "no 'shape'"),
        ] {
            let e = parse_header(&npy(hdr), 1 << 20).unwrap_err();
            assert!(e.contains(why), "{hdr}: {e}");
        }
    }

    #[test]
    fn mutated_files_read_to_a_tensor_or_an_error() {
        // The fuzz target `npy_read` as a deterministic sweep (every CI run): byte flips,
        // truncations and huge values over a valid file with a bool, a big-endian and a float
        // payload.
        let mut files = Vec::new();
        for (descr, item) in [("<f4", 4), ("|b1", 1), (">i8", 8)] {
            let mut f = npy(&format!(
                "{{'descr': '{descr}', 'fortran_order': False, 'shape': (2, 3), }}"
            ));
            f.extend(std::iter::repeat_n(1u8, 6 * item));
            files.push(f);
        }
        let valid = files
            .iter()
            .filter(|f| read_from(&f[..], f.len() as u64).is_ok())
            .count();
        assert_eq!(valid, 3);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let mut f = files[(rnd() % 3) as usize].clone();
            match rnd() % 4 {
                0 => {
                    let i = (rnd() as usize) % f.len();
                    f[i] ^= 1 << (rnd() % 8);
                }
                1 => f.truncate((rnd() as usize) % f.len()),
                2 => {
                    let i = (rnd() as usize) % f.len();
                    f[i] = b"(['9,:}\x00\xff"[(rnd() % 9) as usize];
                }
                _ => {
                    let i = 6 + (rnd() as usize) % 6;
                    f[i] = 0xff;
                }
            }
            if let Ok(t) = read_from(&f[..], f.len() as u64) {
                assert_eq!(t.shape.iter().product::<usize>(), t.len());
            }
        }
    }
}
