//! Command-line options (memcached's, plus the trustee layout) and `stats` assembly.
//!
//! ```
//! use kvs::config::{parse_args, Command};
//! let Command::Run(cfg) = parse_args(["-p", "22122", "-m", "128", "-t", "2"]).unwrap() else {
//!     unreachable!()
//! };
//! assert_eq!((cfg.port, cfg.memory_limit, cfg.threads), (22122, 128 << 20, 2));
//! assert_eq!(cfg.shards, 2);
//! assert!(parse_args(["-I", "512"]).unwrap_err().to_string().contains("1024 bytes"));
//! ```

use std::fmt;

use crate::protocol::{self, Limits};
use crate::store::{ShardConfig, ShardStats};

/// The server's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// TCP port (`-p`, default 11211). In a rack job: rank 0's, and with [`Config::for_rank`]
    /// the rank's own.
    pub port: u16,
    /// One port per rank (`-p 11211,11311,…`); empty: rank `r` listens on `port + r`.
    pub rank_ports: Vec<u16>,
    /// Addresses to listen on (`-l`, comma separated; default all interfaces).
    pub listen: Vec<String>,
    /// Worker threads (`-t`, default 4).
    pub threads: usize,
    /// Item memory in bytes (`-m` megabytes, default 64).
    pub memory_limit: usize,
    /// Return an error instead of evicting when memory is full (`-M`).
    pub no_evictions: bool,
    /// Largest item (`-I`, default 1m; 1k to 1024m, at most half of `-m`).
    pub item_size_max: usize,
    /// Most simultaneous connections (`-c`, default 1024).
    pub max_connections: usize,
    /// Number of table shards, each owned by one trustee (`--shards`, default: `-t`).
    pub shards: usize,
    /// Workers that serve only as trustees (`--dedicated-trustees`, default 0: every
    /// worker is both client and trustee).
    pub dedicated_trustees: usize,
    /// How long an idle worker keeps polling for work and sockets before it blocks, in
    /// microseconds (`--spin-us`); `None` (the default): the runtime's adaptive spin, up to
    /// 50 µs, which stops while the worker's core is shared. Spinning answers a quiet
    /// connection sooner when cores are free, and takes cores from clients on the same machine
    /// when they are not (bench/README, `kvs-unpipelined`).
    pub spin_us: Option<u64>,
    /// Verbosity (`-v`, `-vv`): 0, 1 or 2.
    pub verbose: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            port: 11211,
            rank_ports: Vec::new(),
            listen: Vec::new(),
            threads: 4,
            memory_limit: 64 << 20,
            no_evictions: false,
            item_size_max: 1 << 20,
            max_connections: 1024,
            shards: 4,
            dedicated_trustees: 0,
            spin_us: None,
            verbose: 0,
        }
    }
}

impl Config {
    /// The parser limits for this configuration.
    pub fn limits(&self) -> Limits {
        Limits {
            item_size_max: self.item_size_max,
            ..Limits::default()
        }
    }

    /// The memory limit of one shard.
    pub fn shard_memory(&self) -> usize {
        self.memory_limit / self.shards.max(1)
    }

    /// The configuration of shard `index`.
    pub fn shard(&self, index: usize) -> ShardConfig {
        ShardConfig {
            index: index as u32,
            shards: self.shards as u32,
            mem_limit: self.shard_memory(),
            item_size_max: self.item_size_max,
            evict: !self.no_evictions,
        }
    }

    /// This configuration for rank `rank` of a rack job of `size` ranks: the same, listening on
    /// the rank's port (from the `-p` list, or the base port plus the rank).
    ///
    /// ```
    /// use kvs::config::{parse_args, Command};
    /// let Command::Run(cfg) = parse_args(["-p", "22122"]).unwrap() else { unreachable!() };
    /// assert_eq!(cfg.for_rank(2, 4).unwrap().port, 22124);
    /// let Command::Run(cfg) = parse_args(["-p", "7001,7005"]).unwrap() else { unreachable!() };
    /// assert_eq!(cfg.for_rank(1, 2).unwrap().port, 7005);
    /// assert!(cfg.for_rank(0, 3).unwrap_err().to_string().contains("2 ports for a job of 3"));
    /// ```
    ///
    /// # Errors
    /// If the `-p` list does not give every rank a port, or a port would pass 65535.
    pub fn for_rank(&self, rank: usize, size: usize) -> Result<Config, ConfigError> {
        let port = if self.rank_ports.is_empty() {
            u16::try_from(usize::from(self.port) + rank).or_else(|_| {
                err(format!(
                    "-p: base port {} plus rank {rank} is past 65535",
                    self.port
                ))
            })?
        } else if self.rank_ports.len() != size {
            return err(format!(
                "-p lists {} ports for a job of {size} ranks: give one per rank, or one base \
                 port (rank r listens on base + r)",
                self.rank_ports.len()
            ));
        } else {
            self.rank_ports[rank]
        };
        Ok(Config {
            port,
            ..self.clone()
        })
    }

    /// The socket addresses to bind (`-l` entries with `-p`; `0.0.0.0` when none).
    pub fn bind_addresses(&self) -> Vec<String> {
        if self.listen.is_empty() {
            return vec![format!("0.0.0.0:{}", self.port)];
        }
        self.listen
            .iter()
            .map(|l| {
                if l.parse::<std::net::SocketAddr>().is_ok() {
                    l.clone()
                } else if l.contains(':') {
                    format!("[{l}]:{}", self.port)
                } else {
                    format!("{l}:{}", self.port)
                }
            })
            .collect()
    }
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Run the server.
    Run(Config),
    /// Print [`usage`] and exit.
    Help,
    /// Print the version and exit.
    Version,
}

/// A command-line error, with a message that names the option and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// The help text.
pub fn usage() -> &'static str {
    "kvs: a memcached-compatible key-value server built on trusts\n\
     \n\
     usage: kvs [options]\n\
     -p, --port=<num>[,<num>…]   TCP port to listen on (default: 11211); in a rack job\n\
                                 rank r listens on <num> + r, or on the r-th port listed\n\
     -l, --listen=<addr>         interfaces to listen on, comma separated (default: all)\n\
     -t, --threads=<num>         worker threads (default: 4)\n\
     -m, --memory-limit=<num>    item memory in megabytes (default: 64)\n\
     -M, --disable-evictions     answer an error when memory is full instead of evicting\n\
     -I, --max-item-size=<num>   largest item, with k/m suffix (default: 1m, min: 1k, max: 1024m)\n\
     -c, --conn-limit=<num>      max simultaneous connections (default: 1024)\n\
     -v, -vv                     verbose\n\
     -U, -u                      accepted for compatibility with memcached (UDP is off)\n\
         --shards=<num>          table shards, one per trustee (default: threads)\n\
         --dedicated-trustees=<num>  workers that only serve trustees (default: 0)\n\
         --spin-us=<num>         microseconds an idle worker polls before blocking (default:\n\
                                 adaptive, up to 50, none while a core is shared)\n\
     -h, --help                  print this help and exit\n\
     -V, --version               print version and exit\n"
}

fn number<T: std::str::FromStr>(opt: &str, v: &str) -> Result<T, ConfigError> {
    v.trim()
        .parse()
        .or_else(|_| err(format!("{opt}: '{v}' is not a valid number")))
}

/// The longest `--spin-us` accepted: one second.
const MAX_SPIN_US: u64 = 1_000_000;

/// Parses a size with an optional `k`/`m`/`g` suffix (memcached's `-I` syntax).
fn size(opt: &str, v: &str) -> Result<usize, ConfigError> {
    let t = v.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1usize << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = number(opt, digits)?;
    n.checked_mul(mult)
        .map_or_else(|| err(format!("{opt}: '{v}' is too large")), Ok)
}

/// Parses the command line (without the program name).
pub fn parse_args<I, S>(args: I) -> Result<Command, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut cfg = Config::default();
    let mut shards: Option<usize> = None;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        // Split "--opt=value" and "-p22122" forms.
        let (opt, inline): (String, Option<String>) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((o, v)) => (format!("--{o}"), Some(v.to_string())),
                None => (arg.clone(), None),
            }
        } else if arg.starts_with('-') && arg.len() > 2 && !arg.starts_with("-vv") {
            (arg[..2].to_string(), Some(arg[2..].to_string()))
        } else {
            (arg.clone(), None)
        };
        let mut value = |name: &str| -> Result<String, ConfigError> {
            match inline.clone().or_else(|| args.next()) {
                Some(v) => Ok(v),
                None => err(format!("{name} needs a value (see --help)")),
            }
        };
        match opt.as_str() {
            "-p" | "--port" => {
                let v = value("-p")?;
                let mut ports = Vec::new();
                for p in v.split(',') {
                    match p.trim().parse::<u16>() {
                        Ok(p) => ports.push(p),
                        Err(_) => return err(format!("-p: invalid port number {p}")),
                    }
                }
                cfg.port = ports[0];
                cfg.rank_ports = if ports.len() > 1 { ports } else { Vec::new() };
            }
            "-l" | "--listen" => {
                let v = value("-l")?;
                cfg.listen = v
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if cfg.listen.is_empty() {
                    return err("-l: no address given");
                }
            }
            "-t" | "--threads" => cfg.threads = number("-t", &value("-t")?)?,
            "-m" | "--memory-limit" => {
                let mb: usize = number("-m", &value("-m")?)?;
                cfg.memory_limit = mb
                    .checked_mul(1 << 20)
                    .map_or_else(|| err("-m: memory limit too large"), Ok)?;
            }
            "-M" | "--disable-evictions" => cfg.no_evictions = true,
            "-I" | "--max-item-size" => cfg.item_size_max = size("-I", &value("-I")?)?,
            "-c" | "--conn-limit" => cfg.max_connections = number("-c", &value("-c")?)?,
            "--shards" => shards = Some(number("--shards", &value("--shards")?)?),
            "--dedicated-trustees" => {
                cfg.dedicated_trustees =
                    number("--dedicated-trustees", &value("--dedicated-trustees")?)?;
            }
            "--spin-us" => cfg.spin_us = Some(number("--spin-us", &value("--spin-us")?)?),
            "-v" | "--verbose" => cfg.verbose = (cfg.verbose + 1).min(2),
            "-vv" | "-vvv" => cfg.verbose = 2,
            "-U" | "--udp-port" => {
                let v = value("-U")?;
                if v.trim() != "0" {
                    return err("-U: UDP is not supported; use -U 0 or leave it out");
                }
            }
            "-u" | "--user" => {
                value("-u")?;
            }
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            other => return err(format!("unknown option '{other}' (see --help)")),
        }
    }
    cfg.shards = shards.unwrap_or(cfg.threads);
    validate(&cfg)?;
    Ok(Command::Run(cfg))
}

fn validate(cfg: &Config) -> Result<(), ConfigError> {
    if cfg.threads == 0 {
        return err("-t: number of threads must be greater than 0");
    }
    if cfg.max_connections == 0 {
        return err("-c: maximum connections must be greater than 0");
    }
    if cfg.memory_limit == 0 {
        return err("-m: memory limit must be at least 1 megabyte");
    }
    if cfg.item_size_max < 1024 {
        return err("-I: item max size cannot be less than 1024 bytes");
    }
    if cfg.item_size_max > 1 << 30 {
        return err("-I: cannot set item size limit higher than 1024m");
    }
    if cfg.item_size_max > cfg.memory_limit / 2 {
        return err("-I: cannot set item size limit higher than 1/2 of memory max (-m)");
    }
    if cfg.shards == 0 {
        return err("--shards: number of shards must be greater than 0");
    }
    if cfg.shard_memory() < cfg.item_size_max {
        return err(format!(
            "memory per shard ({} bytes = -m / --shards) is smaller than the item size limit \
             (-I {}): use fewer --shards, a larger -m or a smaller -I",
            cfg.shard_memory(),
            cfg.item_size_max
        ));
    }
    if let Some(spin_us) = cfg.spin_us.filter(|&us| us > MAX_SPIN_US) {
        return err(format!(
            "--spin-us: {spin_us} is more than {MAX_SPIN_US} (1 s); an idle worker that polls \
             longer only burns its core"
        ));
    }
    if cfg.dedicated_trustees >= cfg.threads {
        return err(format!(
            "--dedicated-trustees ({}) must leave at least one of the {} workers (-t) for \
             connections",
            cfg.dedicated_trustees, cfg.threads
        ));
    }
    Ok(())
}

/// Server-wide counters that are not kept by shards: connections and traffic. The server
/// keeps one per connection (or worker) and sums them with [`ServerStats::add`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Open connections.
    pub curr_connections: u64,
    /// Connections accepted since start.
    pub total_connections: u64,
    /// Connections refused because of `-c`.
    pub rejected_connections: u64,
    /// `flush_all` commands.
    pub cmd_flush: u64,
    /// Bytes read from clients.
    pub bytes_read: u64,
    /// Bytes written to clients.
    pub bytes_written: u64,
}

impl ServerStats {
    /// Adds another set of counters to these.
    pub fn add(&mut self, o: &ServerStats) {
        self.curr_connections += o.curr_connections;
        self.total_connections += o.total_connections;
        self.rejected_connections += o.rejected_connections;
        self.cmd_flush += o.cmd_flush;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
    }
}

/// What the `stats` answers need beyond the shards' counters.
#[derive(Clone, Copy, Debug)]
pub struct StatsEnv<'a> {
    /// The configuration.
    pub config: &'a Config,
    /// Server-wide counters, summed.
    pub server: ServerStats,
    /// Unix time the server started.
    pub started: u64,
    /// Unix time now.
    pub now: u64,
}

/// Appends the answer to `stats`: memcached's general statistics, in its order, then `END`.
pub fn render_stats(out: &mut Vec<u8>, env: &StatsEnv<'_>, shards: &ShardStats) {
    use protocol::encode_stat as s;
    let (sv, c) = (&env.server, env.config);
    s(out, "pid", std::process::id());
    s(out, "uptime", env.now.saturating_sub(env.started));
    s(out, "time", env.now);
    s(out, "version", protocol::VERSION);
    s(out, "pointer_size", usize::BITS);
    s(out, "max_connections", c.max_connections);
    s(out, "curr_connections", sv.curr_connections);
    s(out, "total_connections", sv.total_connections);
    s(out, "rejected_connections", sv.rejected_connections);
    s(out, "cmd_get", shards.cmd_get);
    s(out, "cmd_set", shards.cmd_set);
    s(out, "cmd_flush", sv.cmd_flush);
    s(out, "cmd_touch", shards.cmd_touch);
    s(out, "get_hits", shards.get_hits);
    s(out, "get_misses", shards.get_misses);
    s(out, "get_expired", shards.get_expired);
    s(out, "get_flushed", shards.get_flushed);
    s(out, "delete_misses", shards.delete_misses);
    s(out, "delete_hits", shards.delete_hits);
    s(out, "incr_misses", shards.incr_misses);
    s(out, "incr_hits", shards.incr_hits);
    s(out, "decr_misses", shards.decr_misses);
    s(out, "decr_hits", shards.decr_hits);
    s(out, "cas_misses", shards.cas_misses);
    s(out, "cas_hits", shards.cas_hits);
    s(out, "cas_badval", shards.cas_badval);
    s(out, "touch_hits", shards.touch_hits);
    s(out, "touch_misses", shards.touch_misses);
    s(out, "store_too_large", shards.store_too_large);
    s(out, "store_no_memory", shards.store_no_memory);
    s(out, "bytes_read", sv.bytes_read);
    s(out, "bytes_written", sv.bytes_written);
    s(out, "limit_maxbytes", c.memory_limit);
    s(out, "threads", c.threads);
    s(out, "shards", c.shards);
    s(out, "bytes", shards.bytes);
    s(out, "curr_items", shards.curr_items);
    s(out, "total_items", shards.total_items);
    s(out, "expired_unfetched", shards.expired_unfetched);
    s(out, "evicted_unfetched", shards.evicted_unfetched);
    s(out, "evictions", shards.evictions);
    s(out, "reclaimed", shards.reclaimed);
    protocol::encode_line(out, "END");
}

/// Appends the answer to `stats settings`, then `END`.
pub fn render_settings(out: &mut Vec<u8>, c: &Config) {
    use protocol::encode_stat as s;
    s(out, "maxbytes", c.memory_limit);
    s(out, "maxconns", c.max_connections);
    s(out, "tcpport", c.port);
    s(out, "udpport", 0);
    let inter = if c.listen.is_empty() {
        "NULL".to_string()
    } else {
        c.listen.join(",")
    };
    s(out, "inter", inter);
    s(out, "verbosity", c.verbose);
    s(out, "evictions", if c.no_evictions { "off" } else { "on" });
    s(out, "num_threads", c.threads);
    s(out, "cas_enabled", "yes");
    s(out, "item_size_max", c.item_size_max);
    s(out, "flush_enabled", "yes");
    s(out, "shards", c.shards);
    s(out, "dedicated_trustees", c.dedicated_trustees);
    match c.spin_us {
        Some(us) => s(out, "spin_us", us),
        None => s(out, "spin_us", "adaptive"),
    }
    protocol::encode_line(out, "END");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Config {
        match parse_args(args.iter().copied()) {
            Ok(Command::Run(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    fn fails(args: &[&str]) -> String {
        parse_args(args.iter().copied()).unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_memcached_s() {
        let c = run(&[]);
        assert_eq!(c.port, 11211);
        assert_eq!(c.threads, 4);
        assert_eq!(c.memory_limit, 64 << 20);
        assert_eq!(c.item_size_max, 1 << 20);
        assert_eq!(c.max_connections, 1024);
        assert_eq!(c.bind_addresses(), vec!["0.0.0.0:11211"]);
    }

    #[test]
    fn option_forms() {
        let c = run(&[
            "-p22122",
            "--listen=127.0.0.1",
            "-t",
            "2",
            "-I",
            "2m",
            "-m",
            "16",
            "-c",
            "10",
            "--shards",
            "8",
            "--dedicated-trustees=1",
            "--spin-us=0",
            "-vv",
            "-U",
            "0",
        ]);
        assert_eq!(c.port, 22122);
        assert_eq!(c.bind_addresses(), vec!["127.0.0.1:22122"]);
        assert_eq!((c.threads, c.item_size_max, c.shards), (2, 2 << 20, 8));
        assert_eq!(
            (c.dedicated_trustees, c.verbose, c.max_connections),
            (1, 2, 10)
        );
        assert_eq!(c.spin_us, Some(0));
        assert_eq!(run(&[]).spin_us, None, "adaptive unless given");
        assert_eq!(c.shard(3).mem_limit, 2 << 20);
        assert_eq!(run(&["-I", "512k"]).item_size_max, 512 * 1024);
    }

    #[test]
    fn errors_name_the_fix() {
        assert!(fails(&["-m", "1"]).contains("1/2 of memory"));
        assert!(fails(&["-t", "0"]).contains("greater than 0"));
        assert!(fails(&["-c", "0"]).contains("greater than 0"));
        assert!(fails(&["-p", "99999"]).contains("invalid port"));
        assert!(fails(&["-p"]).contains("needs a value"));
        assert!(fails(&["-x"]).contains("unknown option"));
        assert!(fails(&["--spin-us", "2000000"]).contains("more than 1000000"));
        assert!(fails(&["--spin-us", "-1"]).contains("not a valid number"));
        assert!(fails(&["-m", "4", "--shards", "8"]).contains("fewer --shards"));
        assert!(fails(&["-t", "2", "--dedicated-trustees", "2"]).contains("at least one"));
        assert!(fails(&["-I", "2g", "-m", "8192"]).contains("1024m"));
        assert!(fails(&["-U", "11211"]).contains("UDP"));
        assert_eq!(parse_args(["--help"]), Ok(Command::Help));
    }

    #[test]
    fn stats_render() {
        let c = Config::default();
        let env = StatsEnv {
            config: &c,
            server: ServerStats {
                curr_connections: 2,
                ..ServerStats::default()
            },
            started: 100,
            now: 150,
        };
        let mut out = Vec::new();
        let sh = ShardStats {
            curr_items: 5,
            ..ShardStats::default()
        };
        render_stats(&mut out, &env, &sh);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("STAT uptime 50\r\n"));
        assert!(text.contains("STAT curr_connections 2\r\n"));
        assert!(text.contains("STAT curr_items 5\r\n"));
        assert!(text.ends_with("END\r\n"));
    }
}
