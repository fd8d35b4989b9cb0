//! Text renderings of decoded messages: one line per message (like `tshark`'s summary) and a
//! detailed view (`-V`: every field of every layer, indented).

use std::fmt::Write as _;

use super::model::{Body, Message, Private, RdmapInfo, RdsInfo, RpcInfo, RpcRdmaInfo, Seg, Upper};

/// The RPC-over-RDMA header a message carries, if any.
pub fn rpcrdma_of(m: &Message) -> Option<&RpcRdmaInfo> {
    match &m.body {
        Body::Rdmap(RdmapInfo {
            upper: Some(Upper::Rpcrdma(r)),
            ..
        }) => Some(r),
        _ => None,
    }
}

fn segs(out: &mut String, s: &[Seg]) {
    let v: Vec<String> = s
        .iter()
        .map(|s| format!("{:#x}:{}@{:#x}", s.handle, s.length, s.offset))
        .collect();
    out.push_str(&v.join(","));
}

fn rpcrdma_line(out: &mut String, r: &RpcRdmaInfo) {
    let _ = write!(
        out,
        "RPCoRDMA v{} {} xid={:#010x} cr={}",
        r.vers, r.proc_name, r.xid, r.credits
    );
    if let Some(d) = r.direction {
        let _ = write!(out, " dir={d}");
    }
    if let Some(h) = r.inv_handle.filter(|h| *h != 0) {
        let _ = write!(out, " inv={h:#x}");
    }
    for rc in &r.reads {
        let _ = write!(out, " R[pos={} ", rc.position);
        segs(out, &rc.segments);
        out.push(']');
    }
    for w in &r.writes {
        out.push_str(" W[");
        segs(out, w);
        out.push(']');
    }
    if let Some(rc) = &r.reply_chunk {
        out.push_str(" RC[");
        segs(out, rc);
        out.push(']');
    }
    if let Some(e) = &r.error {
        let _ = write!(out, " {e}");
    }
    if let Some(t) = r.opttype {
        let _ = write!(out, " opttype={t}");
    }
    if !r.properties.is_empty() {
        let _ = write!(out, " {}", r.properties.join(" "));
    }
    if let Some(e) = &r.malformed {
        let _ = write!(out, " [malformed: {e}]");
    }
    if let Some(rpc) = &r.rpc {
        out.push_str(" | ");
        rpc_line(out, rpc);
        if let Some(from) = r.rpc_from.filter(|f| *f != "inline") {
            let _ = write!(out, " (from the {from})");
        }
    }
}

/// One RPC message as text.
pub fn rpc_line(out: &mut String, rpc: &RpcInfo) {
    let name = rpc.proc_name.as_deref().unwrap_or("RPC");
    let _ = write!(out, "{name} {} xid={:#010x}", rpc.kind, rpc.xid);
    if let Some(s) = &rpc.reply_stat
        && s != "accepted success"
    {
        let _ = write!(out, " {s}");
    }
    if let Some(n) = &rpc.nfs {
        if let Some(s) = n.status {
            let _ = write!(out, " status={s}");
        }
        if !n.ops.is_empty() {
            let ops: Vec<String> = n
                .ops
                .iter()
                .map(|o| {
                    let mut s = o.op.clone();
                    if let Some(st) = o.status.filter(|s| *s != 0) {
                        let _ = write!(s, "({st})");
                    }
                    s
                })
                .collect();
            let _ = write!(out, " [{}]", ops.join(" "));
        }
        if let Some(fh) = &n.fh {
            let _ = write!(out, " fh={fh}");
        }
        if let Some(o) = n.offset {
            let _ = write!(out, " off={o}");
        }
        if let Some(c) = n.count {
            let _ = write!(out, " cnt={c}");
        }
        if let Some(nm) = &n.name {
            let _ = write!(out, " name={nm:?}");
        }
    }
    if let Some(e) = &rpc.malformed {
        let _ = write!(out, " [{e}]");
    }
}

fn rds_line(out: &mut String, r: &RdsInfo) {
    let _ = write!(
        out,
        "RDS {} seq={} len={} {}→{}",
        r.kind, r.seq, r.len, r.sport, r.dport
    );
    if r.flags != 0 {
        let _ = write!(out, " flags={:#04x}", r.flags);
    }
    if r.credit != 0 {
        let _ = write!(out, " credit={}", r.credit);
    }
    if r.ack != 0 {
        let _ = write!(out, " ack={}", r.ack);
    }
    if !r.extensions.is_empty() {
        let _ = write!(out, " ext=[{}]", r.extensions.join(" "));
    }
    if let Some(p) = &r.congested_ports {
        let _ = write!(out, " congested={p:?}");
    }
    if let Some(f) = r.fragment_len {
        let _ = write!(out, " fragment={f}");
    }
    if let Some(e) = &r.malformed {
        let _ = write!(out, " [malformed: {e}]");
    }
}

/// The summary of a message's body.
pub fn summary(b: &Body) -> String {
    let mut out = String::new();
    match b {
        Body::Mpa(m) => {
            let _ = write!(
                out,
                "MPA {} rev{} crc={} markers={}",
                m.kind, m.revision, m.crc as u8, m.markers as u8
            );
            if m.reject {
                out.push_str(" REJECT");
            }
            if let (Some(i), Some(o)) = (m.ird, m.ord) {
                let _ = write!(out, " ird={i} ord={o}");
            }
            let _ = write!(out, " pd={}", m.private_data_len);
            match &m.private {
                Some(Private::Rpcrdma {
                    send_size,
                    recv_size,
                    remote_invalidate,
                }) => {
                    let _ = write!(
                        out,
                        " [RPC-over-RDMA send={send_size} recv={recv_size} remote_inv={}]",
                        *remote_invalidate as u8
                    );
                }
                Some(Private::Rds {
                    saddr,
                    daddr,
                    major,
                    minor,
                    credit,
                    ..
                }) => {
                    let _ = write!(
                        out,
                        " [RDS {saddr}→{daddr} v{major}.{minor} credit={credit}]"
                    );
                }
                Some(Private::Other { hex }) => {
                    let _ = write!(out, " [{hex}]");
                }
                None => {}
            }
        }
        Body::Rdmap(r) => {
            let _ = write!(out, "{}", r.opcode);
            if let (Some(s), Some(t)) = (r.stag, r.to) {
                let _ = write!(out, " stag={s:#x} to={t:#x}");
            }
            if let (Some(q), Some(m)) = (r.qn, r.msn) {
                let _ = write!(out, " qn={q} msn={m}");
            }
            if let Some(i) = r.inv_stag {
                let _ = write!(out, " inv_stag={i:#x}");
            }
            let _ = write!(out, " len={}", r.len);
            if r.segments > 1 {
                let _ = write!(out, " segs={}", r.segments);
            }
            if r.crc_error {
                out.push_str(" [CRC MISMATCH]");
            }
            if let Some(q) = &r.read {
                let _ = write!(
                    out,
                    " sink={:#x}@{:#x} size={} src={:#x}@{:#x}",
                    q.sink_stag, q.sink_to, q.size, q.src_stag, q.src_to
                );
            }
            if let Some(t) = &r.terminate {
                let _ = write!(
                    out,
                    " {} type={} code={:#04x}: {}",
                    t.layer, t.etype, t.code, t.meaning
                );
            }
            match &r.upper {
                Some(Upper::Rpcrdma(h)) => {
                    out.push_str(" | ");
                    rpcrdma_line(&mut out, h);
                }
                Some(Upper::Rds(d)) => {
                    out.push_str(" | ");
                    rds_line(&mut out, d);
                }
                None => {}
            }
        }
        Body::RdsTcp(r) => rds_line(&mut out, r),
        Body::Gap { missing } => {
            let _ = write!(out, "[TCP gap: {missing} bytes not in the capture]");
        }
        Body::Resync { skipped, how } => {
            let _ = write!(out, "[resynchronised after {skipped} bytes: {how}]");
        }
        Body::Error { what } => {
            let _ = write!(out, "[undecodable: {what}]");
        }
    }
    out
}

/// One line per message; `t0` is the time shown as 0.
pub fn line(m: &Message, t0: f64) -> String {
    format!(
        "{:>6} {:>11.6} s{} {} → {} {}",
        m.frame,
        m.time - t0,
        m.stream,
        m.src,
        m.dst,
        summary(&m.body)
    )
}

fn tree(out: &mut String, v: &serde_json::Value, depth: usize) {
    if let serde_json::Value::Object(map) = v {
        for (k, val) in map {
            node(out, k, val, depth);
        }
    } else {
        let _ = writeln!(out, "{}{}", "    ".repeat(depth), scalar(v));
    }
}

/// One field: scalars and lists of scalars on one line, objects and lists of them nested.
fn node(out: &mut String, key: &str, v: &serde_json::Value, depth: usize) {
    let pad = "    ".repeat(depth);
    match v {
        serde_json::Value::Null => {}
        serde_json::Value::Object(_) => {
            let _ = writeln!(out, "{pad}{key}:");
            tree(out, v, depth + 1);
        }
        serde_json::Value::Array(a) if a.is_empty() => {}
        serde_json::Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            let items: Vec<String> = a.iter().map(scalar).collect();
            let _ = writeln!(out, "{pad}{key}: {}", items.join(", "));
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                node(out, &format!("{key}[{i}]"), x, depth);
            }
        }
        _ => {
            let _ = writeln!(out, "{pad}{key}: {}", scalar(v));
        }
    }
}

fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(a) => {
            let items: Vec<String> = a.iter().map(scalar).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The detailed view: the summary line, then every field, indented.
pub fn detailed(m: &Message, t0: f64) -> String {
    let mut out = line(m, t0);
    out.push('\n');
    if let Ok(v) = serde_json::to_value(&m.body) {
        tree(&mut out, &v, 1);
    }
    out
}
