//! Fixed-precision figures for the JSON forms of the reports (`serialize_with` helpers): a figure
//! is rounded to the decimals the CLI has always printed, and one that is not a finite number is
//! `null` (JSON has no NaN).

use serde::{Serialize, Serializer};

fn round(x: f64, scale: f64) -> Option<f64> {
    x.is_finite().then(|| (x * scale).round() / scale)
}

/// One decimal.
pub(crate) fn f1<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    round(*x, 1e1).serialize(s)
}

/// Three decimals.
pub(crate) fn f3<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    round(*x, 1e3).serialize(s)
}

/// Three decimals, `null` for none.
pub(crate) fn opt3<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    x.and_then(|x| round(x, 1e3)).serialize(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct T {
        #[serde(serialize_with = "f1")]
        a: f64,
        #[serde(serialize_with = "f3")]
        b: f64,
        #[serde(serialize_with = "opt3")]
        c: Option<f64>,
        #[serde(serialize_with = "opt3")]
        d: Option<f64>,
    }

    #[test]
    fn figures_are_rounded_and_not_a_number_is_null() {
        let t = T {
            a: 12.345,
            b: 0.123_456,
            c: Some(f64::NAN),
            d: None,
        };
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"a":12.3,"b":0.123,"c":null,"d":null}"#
        );
    }
}
