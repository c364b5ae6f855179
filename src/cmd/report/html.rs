//! The report as one self-contained HTML page: inline CSS, charts drawn as
//! inline SVG here, and a small inline script that makes tables sortable
//! and filterable. No external asset is referenced, and the page's Content
//! Security Policy forbids loading any, so it can be mailed or attached to a
//! ticket as it is.
//!
//! Everything from a log (host names, paths, client ids) was written by a
//! sandbox: it is HTML-escaped here, and the script only reads the DOM.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::time::parse_date;

use super::text::thousands;
use super::{ExceptionRow, Report, Status};

/// Days drawn in charts (the most recent ones).
const CHART_DAYS: usize = 120;

/// Escapes text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() && c != '\n' => o.push('?'),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = r#"
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dee7; --bg:#f6f7fa; --allow:#2f8f5b; --deny:#c2413b; --warn:#b7791f; --card:#fff; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); margin: 0; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.muted { color: var(--muted); }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; min-width: 130px; }
.card b { display: block; font-size: 20px; }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef1f6; cursor: pointer; user-select: none; white-space: nowrap; }
th.sorted-asc::after { content: " \25B2"; } th.sorted-desc::after { content: " \25BC"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 7px; border-radius: 10px; font-size: 12px; color: #fff; }
.active { background: var(--allow); } .stale, .unused { background: #7a8394; } .expired { background: var(--deny); } .expiring { background: var(--warn); }
pre { background: #0f1420; color: #e6e9ef; padding: 10px; border-radius: 6px; overflow-x: auto; font-size: 12.5px; }
details summary { cursor: pointer; color: #2b5fb3; }
.chart { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px; }
.legend span { margin-right: 14px; } .sw { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
input[type=search] { padding: 6px 8px; width: 280px; border: 1px solid var(--line); border-radius: 6px; margin-bottom: 8px; }
ul { margin: 4px 0; }
"#;

/// Sorting by clicking a header (numbers by `data-v`), a filter box per
/// table, and a summary line counting what rendered — which is also what
/// the browser test looks for.
const SCRIPT: &str = r#"
(function () {
  function key(td) { var v = td.getAttribute('data-v'); return v !== null ? parseFloat(v) : td.textContent.trim().toLowerCase(); }
  document.querySelectorAll('table.sortable').forEach(function (table) {
    var ths = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, i) {
      th.addEventListener('click', function () {
        var asc = !th.classList.contains('sorted-asc');
        Array.prototype.forEach.call(ths, function (h) { h.classList.remove('sorted-asc', 'sorted-desc'); });
        th.classList.add(asc ? 'sorted-asc' : 'sorted-desc');
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = key(a.cells[i]), y = key(b.cells[i]);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
    var box = document.querySelector('input[data-filter="' + table.id + '"]');
    if (box) box.addEventListener('input', function () {
      var q = box.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
        r.style.display = r.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
      });
    });
  });
  var ex = document.querySelectorAll('#exceptions tbody tr').length;
  var de = document.querySelectorAll('#denied tbody tr').length;
  var p = document.createElement('p');
  p.id = 'egressd-summary';
  p.className = 'muted';
  p.textContent = 'Rendered ' + ex + ' exception rows and ' + de + ' denied-destination rows.';
  document.getElementById('top').appendChild(p);
  document.body.setAttribute('data-rendered', 'yes');
})();
"#;

fn day_number(d: &str) -> Option<i64> {
    parse_date(d).map(|s| s / 86400)
}

/// The chart's days: the last [`CHART_DAYS`] days that have any line.
fn chart_days(r: &Report) -> (i64, usize) {
    let last = r.daily.last().and_then(|d| day_number(&d.day));
    let first = r.daily.first().and_then(|d| day_number(&d.day));
    match (first, last) {
        (Some(f), Some(l)) => {
            let n = ((l - f + 1) as usize).min(CHART_DAYS);
            (l - n as i64 + 1, n)
        }
        _ => (0, 0),
    }
}

/// Stacked allowed/denied bars per day.
fn decisions_chart(r: &Report) -> String {
    let (start, n) = chart_days(r);
    if n == 0 {
        return "<p class=\"muted\">No decisions in the logs read.</p>".into();
    }
    let mut by_day: HashMap<i64, (u64, u64)> = HashMap::new();
    for d in &r.daily {
        if let Some(k) = day_number(&d.day) {
            by_day.insert(k, (d.allowed, d.denied));
        }
    }
    let max = (0..n as i64)
        .map(|i| by_day.get(&(start + i)).map_or(0, |(a, d)| a + d))
        .max()
        .unwrap_or(0)
        .max(1);
    let (w, h) = (900.0f64, 160.0f64);
    let bw = w / n as f64;
    let mut s = format!(
        "<svg id=\"decisions-chart\" role=\"img\" aria-label=\"decisions per day\" viewBox=\"0 0 {w} {}\" width=\"100%\" height=\"190\">",
        h + 22.0
    );
    for i in 0..n as i64 {
        let (a, d) = by_day.get(&(start + i)).copied().unwrap_or((0, 0));
        let x = i as f64 * bw;
        let ha = h * a as f64 / max as f64;
        let hd = h * d as f64 / max as f64;
        let day = crate::time::format_date((start + i) * 86400);
        let _ = write!(
            s,
            "<g><title>{day}: {} allowed, {} denied</title>\
             <rect class=\"bar-allow\" x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{ha:.2}\" fill=\"#2f8f5b\"/>\
             <rect class=\"bar-deny\" x=\"{x:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{hd:.2}\" fill=\"#c2413b\"/></g>",
            thousands(a),
            thousands(d),
            h - ha,
            (bw - 1.0).max(0.5),
            h - ha - hd,
            (bw - 1.0).max(0.5),
        );
    }
    let first = crate::time::format_date(start * 86400);
    let last = crate::time::format_date((start + n as i64 - 1) * 86400);
    let _ = write!(
        s,
        "<text x=\"0\" y=\"{}\" font-size=\"11\" fill=\"#5b6475\">{first}</text>\
         <text x=\"{w}\" y=\"{}\" font-size=\"11\" fill=\"#5b6475\" text-anchor=\"end\">{last} · max {}/day</text></svg>",
        h + 16.0,
        h + 16.0,
        thousands(max)
    );
    s
}

/// A small bar chart of one exception's hits per day over the chart's days.
fn sparkline(e: &ExceptionRow, start: i64, n: usize) -> String {
    if n == 0 || e.daily.is_empty() {
        return String::new();
    }
    let vals: HashMap<i64, u64> = e
        .daily
        .iter()
        .filter_map(|(d, c)| day_number(d).map(|k| (k, *c)))
        .collect();
    let max = vals.values().copied().max().unwrap_or(1).max(1);
    let (w, h) = (120.0f64, 24.0f64);
    let bw = w / n as f64;
    let mut s = format!(
        "<svg class=\"spark\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" role=\"img\" aria-label=\"hits per day\">"
    );
    for i in 0..n as i64 {
        if let Some(v) = vals.get(&(start + i)) {
            let bh = (h * *v as f64 / max as f64).max(1.0);
            let _ = write!(
                s,
                "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{bh:.2}\" fill=\"#2f6fb3\"/>",
                i as f64 * bw,
                h - bh,
                bw.max(0.8)
            );
        }
    }
    s.push_str("</svg>");
    s
}

fn hottest_chart(r: &Report) -> String {
    let rows: Vec<&ExceptionRow> = r
        .hottest
        .iter()
        .filter_map(|id| r.exceptions.iter().find(|e| &e.id == id))
        .collect();
    if rows.is_empty() {
        return "<p class=\"muted\">No exception was used in these logs.</p>".into();
    }
    let max = rows[0].hits.max(1);
    let row_h = 22.0;
    let mut s = format!(
        "<svg id=\"hottest-chart\" viewBox=\"0 0 900 {}\" width=\"100%\" role=\"img\" aria-label=\"hottest exceptions\">",
        rows.len() as f64 * row_h
    );
    for (i, e) in rows.iter().enumerate() {
        let y = i as f64 * row_h;
        let bw = 600.0 * e.hits as f64 / max as f64;
        let _ = write!(
            s,
            "<text x=\"0\" y=\"{:.1}\" font-size=\"12\">{}</text>\
             <rect x=\"200\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"16\" fill=\"#2f6fb3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>",
            y + 14.0,
            esc(&e.id),
            y + 2.0,
            206.0 + bw,
            y + 14.0,
            thousands(e.hits)
        );
    }
    s.push_str("</svg>");
    s
}

fn badge(s: Status) -> String {
    format!("<span class=\"badge {0}\">{0}</span>", s.as_str())
}

fn list(items: &[String], more: bool) -> String {
    let mut s = items
        .iter()
        .take(8)
        .map(|c| esc(c))
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > 8 || more {
        s.push_str(" …");
    }
    s
}

pub fn render(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    let mut h = String::with_capacity(64 << 10);
    head(r, &mut h);
    h.push_str("<h2>Decisions per day</h2><div class=\"chart\">");
    h.push_str(&decisions_chart(r));
    h.push_str(
        "<div class=\"legend muted\"><span><i class=\"sw\" style=\"background:#2f8f5b\"></i>allowed</span>\
         <span><i class=\"sw\" style=\"background:#c2413b\"></i>denied</span></div></div>\n",
    );

    exceptions(r, &mut h);
    lists(r, &mut h);
    h.push_str("<h2>Hottest exceptions</h2><div class=\"chart\">");
    h.push_str(&hottest_chart(r));
    h.push_str("</div>\n");

    denied(r, &mut h);
    if !r.other_denials.is_empty() {
        h.push_str("<h2>Denials no exception fixes</h2><ul>");
        for (k, v) in &r.other_denials {
            let _ = write!(h, "<li>{} — {}</li>", esc(k), thousands(*v));
        }
        h.push_str("</ul>\n");
    }
    packages(r, &mut h);
    closing(r, &mut h);
    let _ = write!(h, "<script>{SCRIPT}</script>\n</body></html>\n");
    out.write_all(h.as_bytes())
}

/// The document's head, the title block and the summary cards.
fn head(r: &Report, h: &mut String) {
    let p = &r.policy;
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>egressd exception review — {}</title><style>{CSS}</style></head><body>\n",
        esc(&r.generated_at)
    );
    let _ = write!(
        h,
        "<header id=\"top\"><h1>egressd exception review</h1>\
         <p class=\"muted\">Generated {} from {} log file{} ({} lines, {} → {}) against policy <code>{}</code> \
         ({} exceptions, mode {}, stale_after {} days).</p></header>",
        esc(&r.generated_at),
        r.input.files.len(),
        if r.input.files.len() == 1 { "" } else { "s" },
        thousands(r.input.lines),
        esc(r.input.first_seen.as_deref().unwrap_or("-")),
        esc(r.input.last_seen.as_deref().unwrap_or("-")),
        esc(&p.path),
        p.exceptions,
        p.mode,
        p.stale_after_days
    );
    let cards = [
        ("allowed", thousands(r.totals.allowed)),
        ("denied", thousands(r.totals.denied)),
        ("exceptions", p.exceptions.to_string()),
        ("stale", r.stale.len().to_string()),
        ("expired", r.expired.len().to_string()),
        ("expiring ≤14d", r.expiring.len().to_string()),
        ("denied destinations", r.denied_destinations.to_string()),
    ];
    h.push_str("<div class=\"cards\">");
    for (k, v) in cards {
        let _ = write!(h, "<div class=\"card\"><b>{v}</b>{k}</div>");
    }
    h.push_str("</div>\n");
}

/// The exceptions' table, each with its sparkline.
fn exceptions(r: &Report, h: &mut String) {
    let (start, n) = chart_days(r);
    h.push_str("<h2>Exceptions</h2><input type=\"search\" placeholder=\"filter exceptions\" data-filter=\"exceptions\">");
    h.push_str(
        "<table id=\"exceptions\" class=\"sortable\"><thead><tr><th>id</th><th>status</th><th>owner</th>\
         <th>hits</th><th>last used</th><th>clients</th><th>expires</th><th>ticket</th><th>reason</th>\
         <th>hits per day</th></tr></thead><tbody>\n",
    );
    for e in &r.exceptions {
        let _ = writeln!(
            h,
            "<tr><td><code>{}</code><br><span class=\"muted\">{}:{}</span></td><td>{}</td><td>{}</td>\
             <td class=\"num\" data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.id),
            esc(&e.file),
            e.line,
            badge(e.status),
            esc(&e.owner),
            e.hits,
            thousands(e.hits),
            e.days_since_use.map_or(-1, |d| -d),
            match (&e.last_used, e.days_since_use) {
                (Some(t), Some(d)) => format!("{} <span class=\"muted\">({d} d ago)</span>", esc(&t[..10])),
                _ => "<span class=\"muted\">never</span>".into(),
            },
            list(&e.clients, e.clients_more),
            match (&e.expires, e.expires_in_days) {
                (Some(x), Some(d)) => format!("{} <span class=\"muted\">({d} d)</span>", esc(x)),
                _ => "—".into(),
            },
            esc(e.ticket.as_deref().unwrap_or("—")),
            esc(&e.reason),
            sparkline(e, start, n)
        );
    }
    h.push_str("</tbody></table>\n");
}

/// The stale, unused, expired and expiring lists.
fn lists(r: &Report, h: &mut String) {
    let p = &r.policy;
    let by_id = |id: &String| r.exceptions.iter().find(|e| &e.id == id);
    let section = |h: &mut String,
                   title: &str,
                   id: &str,
                   ids: &[String],
                   what: &dyn Fn(&ExceptionRow) -> String| {
        let _ = write!(h, "<h2 id=\"{id}\">{title} ({})</h2><ul>", ids.len());
        if ids.is_empty() {
            h.push_str("<li class=\"muted\">none</li>");
        }
        for i in ids {
            if let Some(e) = by_id(i) {
                let _ = write!(
                    h,
                    "<li><code>{}</code> — owner {}, {} <span class=\"muted\">({}:{})</span></li>",
                    esc(&e.id),
                    esc(&e.owner),
                    what(e),
                    esc(&e.file),
                    e.line
                );
            }
        }
        h.push_str("</ul>\n");
    };
    let last = |e: &ExceptionRow| match &e.last_used {
        Some(t) => format!("last used {}", esc(&t[..10])),
        None => "never used in these logs".into(),
    };
    section(
        h,
        &format!(
            "Unused for {} days: candidates for removal",
            p.stale_after_days
        ),
        "stale",
        &r.stale,
        &last,
    );
    if !r.unused_recently.is_empty() {
        section(
            h,
            "Unused in these logs (they cover less than stale_after)",
            "unused",
            &r.unused_recently,
            &last,
        );
    }
    let exp = |e: &ExceptionRow| format!("expires {}", esc(e.expires.as_deref().unwrap_or("?")));
    section(h, "Expired", "expired", &r.expired, &exp);
    section(h, "Expiring within 14 days", "expiring", &r.expiring, &exp);
}

/// The most-denied destinations' table, each with its stub.
fn denied(r: &Report, h: &mut String) {
    let _ = write!(
        h,
        "<h2>Most-denied destinations (top {} of {})</h2>\
         <input type=\"search\" placeholder=\"filter destinations\" data-filter=\"denied\">\
         <table id=\"denied\" class=\"sortable\"><thead><tr><th>destination</th><th>denials</th><th>reasons</th>\
         <th>clients</th><th>names</th><th>examples</th><th>exception stub</th></tr></thead><tbody>",
        r.denied.len(),
        r.denied_destinations
    );
    for d in &r.denied {
        let reasons: Vec<String> = d
            .reasons
            .iter()
            .map(|(k, v)| format!("{} {}", esc(k), thousands(*v)))
            .collect();
        let names: Vec<String> = d
            .hosts
            .iter()
            .take(6)
            .map(|(k, v)| format!("{} ({})", esc(k), thousands(*v)))
            .collect();
        let ex: Vec<String> = d
            .examples
            .iter()
            .map(|e| format!("<code>{}</code>", esc(e)))
            .collect();
        let _ = writeln!(
            h,
            "<tr><td><b>{}</b><br><span class=\"muted\">{} → {}</span></td><td class=\"num\" data-v=\"{}\">{}</td>\
             <td>{}</td><td>{}</td><td>{}{}</td><td>{}</td>\
             <td><details><summary>YAML</summary><pre>{}</pre></details></td></tr>",
            esc(&d.domain),
            esc(&d.first_seen[..10]),
            esc(&d.last_seen[..10]),
            d.count,
            thousands(d.count),
            reasons.join("<br>"),
            list(&d.clients, d.clients_more),
            names.join("<br>"),
            if d.hosts.len() > 6 || d.hosts_more { "<br>…" } else { "" },
            ex.join("<br>"),
            esc(&d.stub)
        );
    }
    h.push_str("</tbody></table>\n");
}

/// Exceptions the logs name and the policy lacks, and the notes.
fn closing(r: &Report, h: &mut String) {
    if !r.unknown_exceptions.is_empty() {
        h.push_str("<h2>In the logs but not in this policy</h2><ul>");
        for u in r.unknown_exceptions.iter().take(50) {
            let _ = write!(
                h,
                "<li><code>{}</code> — {} hits, last {}</li>",
                esc(&u.id),
                thousands(u.hits),
                esc(u.last_used.as_deref().unwrap_or("-"))
            );
        }
        h.push_str("</ul>\n");
    }
    if !r.limits.notes.is_empty() {
        h.push_str("<h2>Notes</h2><ul>");
        for n in &r.limits.notes {
            let _ = write!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>\n");
    }
}

/// The package gate's sections (only when the policy has sets or the
/// logs have package denials).
fn packages(r: &Report, h: &mut String) {
    let p = &r.packages;
    if p.sets == 0 && p.denied.is_empty() {
        return;
    }
    let _ = write!(
        h,
        "<h2 id=\"packages\">Packages ({} approved entries in {} sets, enforce {})</h2>\
         <table id=\"packages-approved\" class=\"sortable\"><thead><tr><th>set</th><th>package</th>\
         <th>versions</th><th>status</th><th>fetches</th><th>last fetched</th></tr></thead><tbody>",
        p.approved.len(),
        p.sets,
        esc(&p.enforce.join(", "))
    );
    for a in &p.approved {
        let _ = writeln!(
            h,
            "<tr><td>{}<br><span class=\"muted\">{}:{}</span></td><td>{} <span class=\"muted\">{}</span></td>\
             <td><code>{}</code></td><td>{}</td><td class=\"num\" data-v=\"{}\">{}</td><td>{}</td></tr>",
            esc(&a.set),
            esc(&a.file),
            a.line,
            esc(&a.name),
            a.ecosystem,
            esc(&a.versions),
            badge(a.status),
            a.hits,
            thousands(a.hits),
            esc(a.last_used.as_deref().map_or("never", |t| &t[..10]))
        );
    }
    h.push_str("</tbody></table>\n");
    if p.denied.is_empty() {
        return;
    }
    let _ = write!(
        h,
        "<h2>Most-denied packages (top {} of {})</h2>\
         <table id=\"packages-denied\" class=\"sortable\"><thead><tr><th>package</th><th>denials</th>\
         <th>reasons</th><th>did you mean</th><th>versions</th><th>clients</th></tr></thead><tbody>",
        p.denied.len(),
        p.denied_names
    );
    for d in &p.denied {
        let reasons: Vec<String> = d
            .reasons
            .iter()
            .map(|(k, v)| format!("{} {}", esc(k), thousands(*v)))
            .collect();
        let _ = writeln!(
            h,
            "<tr><td><b>{}</b> <span class=\"muted\">{}</span><br><span class=\"muted\">{} → {}</span></td>\
             <td class=\"num\" data-v=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&d.name),
            esc(&d.ecosystem),
            esc(&d.first_seen[..10]),
            esc(&d.last_seen[..10]),
            d.count,
            thousands(d.count),
            reasons.join("<br>"),
            d.did_you_mean.as_deref().map(esc).unwrap_or_default(),
            list(&d.versions, d.versions_more),
            list(&d.clients, d.clients_more)
        );
    }
    h.push_str("</tbody></table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            esc("<script>alert('x')</script>&\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;"
        );
    }
}
