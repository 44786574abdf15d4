//! The conformance adapter of the Rust client: the JSON lines of
//! clients/conformance/ADAPTER.md on stdin and stdout, each command a task
//! of its own. The conformance runner (clients/conformance/run.py) builds
//! it with `cargo build -p ringlock-client --features tls --example
//! conformance_adapter` and drives it; it is no use on its own.
//!
//! Its JSON reader and writer are the few lines below (flat objects, one
//! array of strings, two nested objects), so that the client crate needs no
//! JSON library, not even as a dev-dependency.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringlock_client::{Acquired, Client, Error, LockLost, RenewingGuard};

/// A parsed JSON value (numbers as f64: every number of ADAPTER.md is an id
/// or milliseconds, well below 2^53; tokens are strings).
#[derive(Debug, Clone)]
enum Json {
    /// `null`, `true`, `false`: no command field of ADAPTER.md needs them.
    Lit,
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(fields) => fields.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn str(&self, key: &str) -> Result<&str, String> {
        match self.get(key) {
            Some(Json::Str(s)) => Ok(s),
            _ => Err(format!("missing string field {key:?}")),
        }
    }

    fn num(&self, key: &str) -> Option<u64> {
        match self.get(key) {
            Some(Json::Num(n)) if *n >= 0.0 && n.is_finite() => Some(*n as u64),
            _ => None,
        }
    }

    fn ms(&self, key: &str) -> Result<Duration, String> {
        self.num(key)
            .map(Duration::from_millis)
            .ok_or_else(|| format!("missing number field {key:?}"))
    }
}

/// A tiny recursive-descent JSON reader (bounded depth).
struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn parse(line: &str) -> Result<Json, String> {
        let mut r = Reader {
            s: line.as_bytes(),
            i: 0,
        };
        let v = r.value(0)?;
        r.ws();
        if r.i != r.s.len() {
            return Err("trailing bytes".into());
        }
        Ok(v)
    }

    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> Result<(), String> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", b as char, self.i))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > 8 {
            return Err("too deep".into());
        }
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Json::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    if self.peek() == Some(b',') {
                        self.i += 1;
                    } else {
                        self.eat(b']')?;
                        return Ok(Json::Arr(items));
                    }
                }
            }
            Some(b'"') => self.string().map(Json::Str),
            Some(_) => self.word(),
            None => Err("unexpected end".into()),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, String> {
        self.eat(b'{')?;
        let mut fields = Vec::new();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(Json::Obj(fields));
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.eat(b':')?;
            fields.push((k, self.value(depth + 1)?));
            if self.peek() == Some(b',') {
                self.i += 1;
            } else {
                self.eat(b'}')?;
                return Ok(Json::Obj(fields));
            }
        }
    }

    fn word(&mut self) -> Result<Json, String> {
        let start = self.i;
        while self
            .s
            .get(self.i)
            .is_some_and(|b| b.is_ascii_alphanumeric() || b"+-.".contains(b))
        {
            self.i += 1;
        }
        let w = std::str::from_utf8(self.s.get(start..self.i).unwrap_or_default())
            .map_err(|e| e.to_string())?;
        match w {
            "null" | "true" | "false" => Ok(Json::Lit),
            _ => w
                .parse::<f64>()
                .map(Json::Num)
                .map_err(|_| format!("bad value {w:?}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.i) != Some(&b'"') {
            return Err(format!("expected a string at byte {}", self.i));
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            let b = *self.s.get(self.i).ok_or("unterminated string")?;
            self.i += 1;
            match b {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let e = *self.s.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    match e {
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u")?;
                            self.i += 4;
                            let code =
                                u32::from_str_radix(std::str::from_utf8(hex).unwrap_or("?"), 16)
                                    .map_err(|e| e.to_string())?;
                            let c = char::from_u32(code).unwrap_or('\u{fffd}');
                            out.extend_from_slice(c.to_string().as_bytes());
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
    }
}

/// A JSON string literal.
fn q(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes one whole line on stdout.
fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(line.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout => "timeout",
        Error::Connection(_) => "connection",
        Error::NoActiveNode => "no_active",
        Error::Protocol(_) => "protocol",
        Error::InvalidArgument(_) => "invalid_argument",
        Error::NotAllowed(_) => "not_allowed",
        _ => "other",
    }
}

/// A failed command: its error kind and message.
struct Failure(&'static str, String);

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure(kind(&e), e.to_string())
    }
}

impl From<String> for Failure {
    fn from(why: String) -> Failure {
        Failure("unsupported", why)
    }
}

#[derive(Default)]
struct State {
    client: Mutex<Option<Client>>,
    closed: std::sync::atomic::AtomicBool,
    locks: Mutex<HashMap<u64, RenewingGuard>>,
}

impl State {
    fn client(&self) -> Result<Client, Failure> {
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Failure("closed", "the client is closed".into()));
        }
        self.client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Failure("closed", "no connect yet".into()))
    }
}

const OPTIONS: [&str; 9] = [
    "connect_timeout_ms",
    "probe_interval_ms",
    "probe_timeout_ms",
    "acquire_grace_ms",
    "request_timeout_ms",
    "retry_every_ms",
    "retry_for_ms",
    "redial_interval_ms",
    "no_active_timeout_ms",
];

async fn connect(state: &State, cmd: &Json) -> Result<String, Failure> {
    let addrs: Vec<String> = match cmd.get("addrs") {
        Some(Json::Arr(items)) => items
            .iter()
            .filter_map(|a| match a {
                Json::Str(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => return Err(Failure("invalid_argument", "no addrs".into())),
    };
    let mut b = Client::builder(addrs);
    let none = Json::Obj(Vec::new());
    let opts = cmd.get("options").unwrap_or(&none);
    if let Json::Obj(fields) = opts
        && let Some((name, _)) = fields.iter().find(|(k, _)| !OPTIONS.contains(&k.as_str()))
    {
        return Err(format!("option {name}").into());
    }
    let ms = |k: &str| opts.num(k).map(Duration::from_millis);
    if let Some(d) = ms("connect_timeout_ms") {
        b = b.connect_timeout(d);
    }
    if let Some(d) = ms("probe_interval_ms") {
        b = b.probe_interval(d);
    }
    if let Some(d) = ms("probe_timeout_ms") {
        b = b.probe_timeout(d);
    }
    if let Some(d) = ms("acquire_grace_ms") {
        b = b.acquire_grace(d);
    }
    if let Some(d) = ms("request_timeout_ms") {
        b = b.request_timeout(d);
    }
    if let Some(d) = ms("redial_interval_ms") {
        b = b.redial_interval(d);
    }
    if let Some(d) = ms("no_active_timeout_ms") {
        b = b.no_active_timeout(d);
    }
    if ms("retry_every_ms").is_some() || ms("retry_for_ms").is_some() {
        let every = ms("retry_every_ms").unwrap_or(Duration::from_millis(200));
        b = b.release_retries(every, ms("retry_for_ms").unwrap_or(Duration::from_secs(5)));
    }
    if let Some(tls) = cmd.get("tls") {
        b = with_tls(b, tls)?;
    }
    let client = b.connect().await?;
    *state.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client);
    Ok(String::new())
}

#[cfg(feature = "tls")]
fn with_tls(
    b: ringlock_client::ClientBuilder,
    tls: &Json,
) -> Result<ringlock_client::ClientBuilder, Failure> {
    let ca = tls.str("ca_file")?;
    let pair = match (tls.str("cert_file"), tls.str("key_file")) {
        (Ok(c), Ok(k)) => Some((c, k)),
        _ => None,
    };
    let mut config = ringlock_client::TlsConfig::from_pem_files(ca, pair)?;
    if let Ok(name) = tls.str("server_name") {
        config = config.server_name(name);
    }
    Ok(b.tls(config))
}

#[cfg(not(feature = "tls"))]
fn with_tls(
    _: ringlock_client::ClientBuilder,
    _: &Json,
) -> Result<ringlock_client::ClientBuilder, Failure> {
    Err("TLS (build with --features tls)".to_string().into())
}

fn granted(outcome: Acquired) -> String {
    match outcome {
        Acquired::Granted(g) => format!(r#""granted": true, "token": "{}""#, g.token()),
        Acquired::TimedOut => r#""granted": false"#.to_string(),
    }
}

fn wait_of(cmd: &Json) -> Option<Duration> {
    cmd.num("wait_ms")
        .filter(|&w| w > 0)
        .map(Duration::from_millis)
}

fn token_of(cmd: &Json) -> Result<u64, Failure> {
    cmd.str("token")?
        .parse()
        .map_err(|_| Failure("invalid_argument", "token is not a number".into()))
}

async fn lock_renewing(state: &Arc<State>, id: u64, cmd: &Json) -> Result<String, Failure> {
    let client = state.client()?;
    let guard = match client
        .lock_renewing(cmd.str("key")?, cmd.ms("lease_ms")?, wait_of(cmd))
        .await
    {
        Ok(g) => g,
        Err(Error::Timeout) => return Ok(r#""granted": false"#.into()),
        Err(e) => return Err(e.into()),
    };
    let token = guard.token();
    let watch = guard.watch();
    tokio::spawn(async move {
        if let Some(lost) = watch.lost().await {
            let reason = match lost {
                LockLost::Refused => "refused",
                LockLost::Expired { .. } => "expired",
            };
            emit(&format!(
                r#"{{"event": "lost", "lock": {id}, "reason": "{reason}", "message": {}}}"#,
                q(&lost.to_string())
            ));
        }
    });
    state
        .locks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id, guard);
    Ok(format!(
        r#""granted": true, "token": "{token}", "lock": {id}"#
    ))
}

async fn unlock(state: &State, cmd: &Json) -> Result<String, Failure> {
    let id = cmd.num("lock").unwrap_or(0);
    let guard = state
        .locks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id);
    let Some(guard) = guard else {
        return Ok(r#""released": false"#.into());
    };
    let lost = guard.is_lost();
    let released = guard.release().await? && !lost;
    Ok(format!(r#""released": {released}"#))
}

async fn status(client: &Client) -> String {
    let nodes: Vec<String> = client
        .status()
        .await
        .into_iter()
        .map(|s| match s.status {
            Ok(n) => format!(
                r#"{{"addr": {}, "ok": true, "role": "{}", "active": {}, "token": "{}"}}"#,
                q(&s.addr),
                n.role.as_str(),
                q(n.active.as_deref().unwrap_or("-")),
                n.token
            ),
            Err(e) => format!(
                r#"{{"addr": {}, "ok": false, "error": "{}", "message": {}}}"#,
                q(&s.addr),
                kind(&e),
                q(&e.to_string())
            ),
        })
        .collect();
    format!(r#""nodes": [{}]"#, nodes.join(", "))
}

async fn run(state: Arc<State>, id: u64, cmd: Json) -> Result<String, Failure> {
    let op = cmd.str("cmd").unwrap_or("");
    if op == "connect" {
        return connect(&state, &cmd).await;
    }
    let client = match op {
        "acquire" | "try_acquire" | "release" | "renew" | "lock_renewing" | "unlock" | "status"
        | "stats" | "close" => state.client()?,
        other => return Err(format!("command {other:?}").into()),
    };
    let key = cmd.str("key");
    match op {
        "acquire" => Ok(granted(
            client
                .acquire(key?, cmd.ms("lease_ms")?, wait_of(&cmd))
                .await?,
        )),
        "try_acquire" => Ok(granted(
            client.try_acquire(key?, cmd.ms("lease_ms")?).await?,
        )),
        "release" => {
            let released = client.release(key?, token_of(&cmd)?).await?;
            Ok(format!(r#""released": {released}"#))
        }
        "renew" => {
            let lease = cmd.ms("lease_ms")?;
            let renewed = client.renew(key?, token_of(&cmd)?, lease).await?;
            Ok(format!(r#""renewed": {renewed}"#))
        }
        "lock_renewing" => lock_renewing(&state, id, &cmd).await,
        "unlock" => unlock(&state, &cmd).await,
        "status" => Ok(status(&client).await),
        "stats" => Ok(format!(
            r#""connected": {}, "connections": {}"#,
            client.connected(),
            client.connections()
        )),
        _ => {
            state
                .closed
                .store(true, std::sync::atomic::Ordering::SeqCst);
            state
                .locks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
            state
                .client
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            Ok(String::new())
        }
    }
}

async fn answer(state: Arc<State>, line: String) {
    let (id, outcome) = match Reader::parse(&line) {
        Ok(cmd) => {
            let id = cmd.num("id").unwrap_or(0);
            (id, run(state, id, cmd).await)
        }
        Err(why) => (0, Err(Failure("unsupported", format!("bad line: {why}")))),
    };
    match outcome {
        Ok(fields) if fields.is_empty() => emit(&format!(r#"{{"id": {id}, "ok": true}}"#)),
        Ok(fields) => emit(&format!(r#"{{"id": {id}, "ok": true, {fields}}}"#)),
        Err(Failure(kind, message)) => emit(&format!(
            r#"{{"id": {id}, "ok": false, "error": "{kind}", "message": {}}}"#,
            q(&message)
        )),
    }
}

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("conformance_adapter: no runtime: {e}");
            std::process::exit(1);
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // stdin is read on a thread of its own (the client's tokio has no io-std).
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if !line.trim().is_empty() && tx.send(line).is_err() {
                break;
            }
        }
    });
    runtime.block_on(async {
        let state = Arc::new(State::default());
        while let Some(line) = rx.recv().await {
            tokio::spawn(answer(state.clone(), line));
        }
        // End of input: close the client (its connections close when the
        // last clone is dropped), bounded.
        state
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        state
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        tokio::time::sleep(Duration::from_millis(50)).await;
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
}
