//! What a YAML scalar means: the YAML 1.2 core schema, resolved as serde_yaml 0.9 did, so
//! manifests read the same after the move off serde_yaml (`yes` and `on` stay strings,
//! `0x1F` is a number, `007` is a string, integers keep all 64 bits).

use saphyr_parser::{ScalarStyle, Tag};
use serde_json::Value;

/// The value of a scalar with its style and tag; `Err` says why the tag does not fit.
pub(crate) fn resolve(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    let plain = style == ScalarStyle::Plain;
    match tag {
        Some(tag) if tag.is_yaml_core_schema() => core_tagged(text, &tag.suffix),
        // A local tag (`!thing 12`) means nothing to manifests: the value is read as untagged.
        Some(tag) if tag.handle == "!" && plain => untagged(text),
        Some(_) => Ok(Value::String(text.to_string())),
        None if plain => untagged(text),
        None => Ok(Value::String(text.to_string())),
    }
}

/// A scalar the text wrote without quotes or tag.
fn untagged(text: &str) -> Result<Value, String> {
    if text.is_empty() || is_null(text) {
        return Ok(Value::Null);
    }
    if let Some(b) = boolean(text) {
        return Ok(Value::Bool(b));
    }
    if let Some(n) = integer(text)? {
        return Ok(n);
    }
    if !leading_zero_digits(text)
        && let Some(f) = float(text)
    {
        return Ok(float_value(f));
    }
    Ok(Value::String(text.to_string()))
}

/// `!!bool`, `!!int`, `!!float`, `!!null` must fit their value; `!!str` and the others keep
/// the text.
fn core_tagged(text: &str, suffix: &str) -> Result<Value, String> {
    let wrong = |what: &str| format!("`!!{suffix} {text}` is not {what}");
    match suffix {
        "bool" => boolean(text)
            .map(Value::Bool)
            .ok_or_else(|| wrong("a boolean")),
        "int" => integer(text)?.ok_or_else(|| wrong("an integer")),
        "float" => float(text).map(float_value).ok_or_else(|| wrong("a float")),
        "null" if is_null(text) => Ok(Value::Null),
        "null" => Err(wrong("null")),
        _ => Ok(Value::String(text.to_string())),
    }
}

fn is_null(text: &str) -> bool {
    matches!(text, "~" | "null" | "Null" | "NULL")
}

fn boolean(text: &str) -> Option<bool> {
    match text {
        "true" | "True" | "TRUE" => Some(true),
        "false" | "False" | "FALSE" => Some(false),
        _ => None,
    }
}

/// Decimal, `0x`, `0o` or `0b`, signed or not, within i64 or u64. An integer past 64 bits is
/// an error rather than a float, so no digit is silently lost.
fn integer(text: &str) -> Result<Option<Value>, String> {
    if let Some(u) = unsigned::<u64>(text, u64::from_str_radix) {
        return Ok(Some(Value::from(u)));
    }
    if let Some(i) = negative::<i64>(text, i64::from_str_radix) {
        return Ok(Some(Value::from(i)));
    }
    let wide = unsigned::<u128>(text, u128::from_str_radix).is_some()
        || negative::<i128>(text, i128::from_str_radix).is_some();
    if wide {
        return Err(format!(
            "the integer {text} does not fit in 64 bits (the range is {} to {})",
            i64::MIN,
            u64::MAX
        ));
    }
    Ok(None)
}

type Radix<T> = fn(&str, u32) -> Result<T, std::num::ParseIntError>;

/// Strips `+` and a radix prefix, like serde_yaml.
fn unsigned<T>(text: &str, parse: Radix<T>) -> Option<T> {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = unsigned.strip_prefix(prefix) {
            if digits.starts_with(['+', '-']) {
                return None;
            }
            if let Ok(n) = parse(digits, radix) {
                return Some(n);
            }
        }
    }
    if unsigned.starts_with(['+', '-']) || leading_zero_digits(text) {
        return None;
    }
    parse(unsigned, 10).ok()
}

fn negative<T>(text: &str, parse: Radix<T>) -> Option<T> {
    for (prefix, radix) in [("-0x", 16), ("-0o", 8), ("-0b", 2)] {
        if let Some(digits) = text.strip_prefix(prefix)
            && let Ok(n) = parse(&format!("-{digits}"), radix)
        {
            return Some(n);
        }
    }
    if leading_zero_digits(text) {
        return None;
    }
    parse(text, 10).ok()
}

/// `.inf`, `-.inf`, `.nan` and finite decimals (`1e400` overflows and stays a string).
fn float(text: &str) -> Option<f64> {
    let unsigned = match text.strip_prefix('+') {
        Some(rest) if rest.starts_with(['+', '-']) => return None,
        Some(rest) => rest,
        None => text,
    };
    match (unsigned, text) {
        (".inf" | ".Inf" | ".INF", _) => Some(f64::INFINITY),
        (_, "-.inf" | "-.Inf" | "-.INF") => Some(f64::NEG_INFINITY),
        (_, ".nan" | ".NaN" | ".NAN") => Some(f64::NAN),
        _ => unsigned.parse::<f64>().ok().filter(|f| f.is_finite()),
    }
}

/// JSON has no infinity or NaN: those become the strings `.inf`, `-.inf`, `.nan`, so a later
/// type check names them instead of reading `null`.
fn float_value(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or_else(
        || {
            let text = match f {
                f if f.is_nan() => ".nan",
                f if f > 0.0 => ".inf",
                _ => "-.inf",
            };
            Value::String(text.into())
        },
        Value::Number,
    )
}

/// `007`, `-01`: YAML 1.2 reads leading zeros followed by digits as a string.
fn leading_zero_digits(text: &str) -> bool {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    digits.len() > 1 && digits.starts_with('0') && digits[1..].bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plain(text: &str) -> Value {
        resolve(text, ScalarStyle::Plain, None).unwrap()
    }

    #[test]
    fn core_schema_like_serde_yaml() {
        assert_eq!(plain(""), Value::Null);
        assert_eq!(plain("~"), Value::Null);
        assert_eq!(plain("True"), json!(true));
        assert_eq!(plain("yes"), json!("yes"));
        assert_eq!(plain("on"), json!("on"));
        assert_eq!(plain("0x1F"), json!(31));
        assert_eq!(plain("-0o17"), json!(-15));
        assert_eq!(plain("+12"), json!(12));
        assert_eq!(plain("007"), json!("007"));
        assert_eq!(plain("18446744073709551615"), json!(u64::MAX));
        assert_eq!(plain("-9223372036854775808"), json!(i64::MIN));
        assert_eq!(plain("1.5"), json!(1.5));
        assert_eq!(plain("1e3"), json!(1000.0));
        assert_eq!(plain("1e400"), json!("1e400"));
        assert_eq!(plain("-.inf"), json!("-.inf"));
        assert_eq!(plain(".NaN"), json!(".nan"));
        assert_eq!(plain("inf"), json!("inf"));
        assert!(resolve("18446744073709551616", ScalarStyle::Plain, None).is_err());
    }

    #[test]
    fn quotes_and_tags() {
        let quoted = resolve("12", ScalarStyle::DoubleQuoted, None).unwrap();
        assert_eq!(quoted, json!("12"));
        let core = |suffix: &str, text: &str, style| {
            let tag = Tag {
                handle: "tag:yaml.org,2002:".into(),
                suffix: suffix.into(),
            };
            resolve(text, style, Some(&tag))
        };
        assert_eq!(core("str", "12", ScalarStyle::Plain), Ok(json!("12")));
        assert_eq!(core("int", "12", ScalarStyle::SingleQuoted), Ok(json!(12)));
        assert!(core("bool", "yes", ScalarStyle::Plain).is_err());
        let local = Tag {
            handle: "!".into(),
            suffix: "thing".into(),
        };
        let tagged = resolve("12", ScalarStyle::Plain, Some(&local)).unwrap();
        assert_eq!(tagged, json!(12));
    }
}
