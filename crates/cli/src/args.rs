//! A small argument parser: positional arguments, `--flag`, `--key value` / `--key=value`,
//! repeatable keys. Unknown options are errors naming the option.

use std::collections::BTreeMap;

/// Parsed arguments of one subcommand.
#[derive(Debug, Default)]
pub struct Args {
    pub positional: Vec<String>,
    values: BTreeMap<String, Vec<String>>,
    flags: Vec<String>,
}

impl Args {
    /// Parses `argv` given which options take a value and which are flags.
    pub fn parse(argv: &[String], valued: &[&str], flags: &[&str]) -> Result<Args, String> {
        let mut a = Args::default();
        let mut it = argv.iter();
        while let Some(arg) = it.next() {
            if let Some(opt) = arg.strip_prefix("--") {
                let (key, inline) = match opt.split_once('=') {
                    Some((k, v)) => (k, Some(v.to_owned())),
                    None => (opt, None),
                };
                if valued.contains(&key) {
                    let v = match inline {
                        Some(v) => v,
                        None => it
                            .next()
                            .ok_or_else(|| format!("--{key} needs a value"))?
                            .clone(),
                    };
                    a.values.entry(key.to_owned()).or_default().push(v);
                } else if flags.contains(&key) && inline.is_none() {
                    a.flags.push(key.to_owned());
                } else {
                    return Err(format!("unknown option --{key}"));
                }
            } else if arg == "-o" {
                let v = it.next().ok_or("-o needs a value")?.clone();
                a.values.entry("output".into()).or_default().push(v);
            } else {
                a.positional.push(arg.clone());
            }
        }
        Ok(a)
    }

    pub fn flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }

    pub fn value(&self, k: &str) -> Option<&str> {
        self.values
            .get(k)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    pub fn values(&self, k: &str) -> &[String] {
        self.values.get(k).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn parsed<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T, String> {
        match self.value(k) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{k} {v:?} is not valid")),
        }
    }
}

/// Splits `name=value`.
pub fn name_value(s: &str, what: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{what} {s:?} is not NAME=VALUE"))
}

/// Parses `1,3,224,224`.
pub fn dims(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("dimension {d:?} in {s:?} is not a number"))
        })
        .collect()
}
