//! The suite's output: a text table and JUnit XML (one `<testsuite>`, a `<testcase>` per
//! case, `<failure>` for a failed case and `<skipped>` for one not applicable).

use std::fmt::Write;

use super::{CaseResult, Outcome};

/// Counts of pass, fail and not applicable.
pub fn counts(r: &[CaseResult]) -> (usize, usize, usize) {
    let n = |o| r.iter().filter(|c| c.outcome == o).count();
    (
        n(Outcome::Pass),
        n(Outcome::Fail),
        n(Outcome::NotApplicable),
    )
}

/// One line per case: id, result, citation, what was seen; then the totals.
pub fn table(target: &str, r: &[CaseResult]) -> String {
    let idw = r.iter().map(|c| c.id.len()).max().unwrap_or(4).max(4);
    let citew = r.iter().map(|c| c.cite.len()).max().unwrap_or(4).max(4);
    let mut s = String::new();
    let _ = writeln!(s, "conformance of {target}");
    let _ = writeln!(
        s,
        "{:idw$}  {:6}  {:citew$}  detail",
        "case", "result", "cite"
    );
    for c in r {
        let _ = writeln!(
            s,
            "{:idw$}  {:6}  {:citew$}  {}",
            c.id,
            c.outcome.label(),
            c.cite,
            c.detail
        );
    }
    let (p, f, n) = counts(r);
    let _ = writeln!(s, "{p} pass, {f} fail, {n} not applicable");
    s
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // XML 1.0 has no other control characters.
            c if c.is_control() && c != '\n' && c != '\t' => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML of the results.
pub fn junit_xml(target: &str, r: &[CaseResult]) -> String {
    let (_, f, n) = counts(r);
    let time: f64 = r.iter().map(|c| c.seconds).sum();
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        s,
        "<testsuite name=\"oxrdma conform {}\" tests=\"{}\" failures=\"{f}\" errors=\"0\" \
         skipped=\"{n}\" time=\"{time:.3}\">",
        esc(target),
        r.len()
    );
    for c in r {
        let _ = write!(
            s,
            "  <testcase classname=\"conform\" name=\"{} ({})\" time=\"{:.3}\"",
            esc(c.id),
            esc(c.cite),
            c.seconds
        );
        match c.outcome {
            Outcome::Pass => {
                let _ = writeln!(
                    s,
                    ">\n    <system-out>{}</system-out>\n  </testcase>",
                    esc(&c.detail)
                );
            }
            Outcome::Fail => {
                let _ = writeln!(
                    s,
                    ">\n    <failure message=\"{}\">{}: {}</failure>\n  </testcase>",
                    esc(&c.detail),
                    esc(c.title),
                    esc(&c.detail)
                );
            }
            Outcome::NotApplicable => {
                let _ = writeln!(
                    s,
                    ">\n    <skipped message=\"{}\"/>\n  </testcase>",
                    esc(&c.detail)
                );
            }
        }
    }
    s.push_str("</testsuite>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: &'static str, outcome: Outcome, detail: &str) -> CaseResult {
        CaseResult {
            id,
            cite: "RFC 8166 §4.5",
            title: "t",
            outcome,
            detail: detail.into(),
            seconds: 0.5,
        }
    }

    #[test]
    fn junit_counts_and_escapes() {
        let x = junit_xml(
            "rdma://h:1",
            &[
                r("a", Outcome::Pass, "ok"),
                r("b", Outcome::Fail, "got <4> & \"x\""),
                r("c", Outcome::NotApplicable, "none"),
            ],
        );
        assert!(x.contains("tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(x.contains("got &lt;4&gt; &amp; &quot;x&quot;"));
        assert_eq!(x.matches("<testcase ").count(), 3);
        assert_eq!(x.matches("<failure ").count(), 1);
        assert_eq!(x.matches("<skipped ").count(), 1);
    }

    #[test]
    fn the_table_has_a_line_per_case_and_the_totals() {
        let t = table(
            "x",
            &[r("a", Outcome::Pass, "ok"), r("b", Outcome::Fail, "bad")],
        );
        assert_eq!(t.lines().count(), 5);
        assert!(t.contains("1 pass, 1 fail, 0 not applicable"));
        assert!(t.lines().any(|l| l.starts_with("b ") && l.contains("FAIL")));
    }
}
