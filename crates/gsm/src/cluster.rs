//! The client side of the cluster's commands: `gsm ps`, `gsm kill`, `gsm cluster-key`, and
//! what `gsm run --hosts` shares with them (the key, the host list, the connections).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::thread;

use anyhow::{Context, anyhow, bail};
use gossamer::cluster::{
    Channel, ClusterKey, DEFAULT_PORT, FrameReader, FrameWriter, HANDSHAKE_LIMIT, Reply, Request,
};

/// Seconds since the Unix epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `~/.gossamer`.
pub(crate) fn gossamer_dir() -> anyhow::Result<PathBuf> {
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".gossamer")),
        None => bail!("HOME is not set: give the file or directory explicitly"),
    }
}

/// The cluster key's default place: `~/.gossamer/cluster.key`.
pub(crate) fn default_key() -> anyhow::Result<PathBuf> {
    Ok(gossamer_dir()?.join("cluster.key"))
}

/// The key in `path`, or at the default place.
pub(crate) fn load_key(path: Option<&PathBuf>) -> anyhow::Result<ClusterKey> {
    let path = match path {
        Some(path) => path.clone(),
        None => default_key()?,
    };
    Ok(ClusterKey::load(&path)?)
}

/// Where to reach the daemons: options shared by `gsm ps` and `gsm kill`.
#[derive(clap::Args, Debug)]
pub(crate) struct Daemons {
    /// The daemons' hosts, comma-separated: `name`, `address` or either with `:port`.
    #[arg(long, value_name = "HOSTS", default_value = "127.0.0.1")]
    hosts: String,
    /// The cluster key [default: ~/.gossamer/cluster.key].
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
}

/// A daemon's host as given, and where it listens.
#[derive(Clone, Debug)]
pub(crate) struct Host {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
}

/// Reads `a,b:7421,[fd00::2]:7420`; a host without a port gets [`DEFAULT_PORT`]. Names are
/// resolved here, once, IPv4 first.
pub(crate) fn parse_hosts(list: &str) -> Result<Vec<Host>, String> {
    let mut hosts = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!("--hosts '{list}' has an empty entry"));
        }
        let bare = name.strip_prefix('[').and_then(|n| n.strip_suffix(']'));
        let addr = if let Ok(addr) = name.parse::<SocketAddr>() {
            addr
        } else if let Ok(ip) = bare.unwrap_or(name).parse::<IpAddr>() {
            SocketAddr::new(ip, DEFAULT_PORT)
        } else {
            let with_port = if name.contains(':') {
                name.to_string()
            } else {
                format!("{name}:{DEFAULT_PORT}")
            };
            let found = with_port
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve host '{name}': {e}"))?
                .min_by_key(|a| a.is_ipv6());
            found.ok_or_else(|| format!("host '{name}' has no address"))?
        };
        if hosts.iter().any(|h: &Host| h.addr == addr) {
            return Err(format!("host '{name}' ({addr}) is given twice"));
        }
        hosts.push(Host {
            name: name.to_string(),
            addr,
        });
    }
    Ok(hosts)
}

/// A conversation with one daemon, both directions.
pub(crate) type Conversation = (
    FrameReader<std::net::TcpStream>,
    FrameWriter<std::net::TcpStream>,
);

/// Connects to every host at once; the first failure names its host.
pub(crate) fn connect_all(hosts: &[Host], key: &ClusterKey) -> anyhow::Result<Vec<Conversation>> {
    let dials: Vec<_> = hosts
        .iter()
        .map(|h| {
            let (addr, key) = (h.addr, key.clone());
            thread::spawn(move || Channel::dial(addr, &key, HANDSHAKE_LIMIT)?.split())
        })
        .collect();
    dials
        .into_iter()
        .zip(hosts)
        .map(|(dial, host)| {
            let result = dial
                .join()
                .map_err(|_| anyhow!("connecting to {} panicked", host.name))?;
            result.with_context(|| format!("host {}", host.name))
        })
        .collect()
}

/// Asks one request of each daemon and gathers the answers, in the order of `hosts`.
fn ask_all(options: &Daemons, request: &Request) -> anyhow::Result<Vec<(Host, Reply)>> {
    let hosts = parse_hosts(&options.hosts).map_err(|e| anyhow!(e))?;
    let key = load_key(options.key.as_ref())?;
    let conversations = connect_all(&hosts, &key)?;
    let mut answers = Vec::with_capacity(hosts.len());
    for (host, (mut from, mut to)) in hosts.into_iter().zip(conversations) {
        from.get_ref().set_read_timeout(Some(HANDSHAKE_LIMIT))?;
        to.send(request)
            .with_context(|| format!("host {}", host.name))?;
        let reply = from.recv().with_context(|| format!("host {}", host.name))?;
        answers.push((host, reply));
    }
    Ok(answers)
}

/// Options of `gsm ps`.
#[derive(clap::Args, Debug)]
pub(crate) struct PsOptions {
    #[command(flatten)]
    daemons: Daemons,
}

/// `gsm ps`: one line per job and host.
pub(crate) fn ps(options: &PsOptions) -> anyhow::Result<()> {
    println!(
        "{:<16}  {:<22}  {:<20}  {:<8}  PROGRAM",
        "JOB", "HOST", "RANKS (PID)", "AGE"
    );
    for (host, reply) in ask_all(&options.daemons, &Request::List)? {
        let Reply::Jobs(jobs) = reply else {
            bail!("host {} answered a listing with {reply:?}", host.name);
        };
        for job in jobs {
            let ranks: Vec<String> = job
                .ranks
                .iter()
                .map(|(r, p)| format!("{r} ({p})"))
                .collect();
            let age = now_secs().saturating_sub(job.started);
            println!(
                "{:016x}  {:<22}  {:<20}  {:<8}  {}",
                job.job,
                host.name,
                ranks.join(" "),
                format!("{age}s"),
                job.program
            );
        }
    }
    Ok(())
}

/// Options of `gsm kill`.
#[derive(clap::Args, Debug)]
pub(crate) struct KillOptions {
    /// The job id, as `gsm ps` and `gsm run` show it (hex).
    #[arg(value_name = "JOB", value_parser = parse_job)]
    job: u64,
    #[command(flatten)]
    daemons: Daemons,
}

fn parse_job(text: &str) -> Result<u64, String> {
    let digits = text.strip_prefix("0x").unwrap_or(text);
    u64::from_str_radix(digits, 16).map_err(|_| format!("'{text}' is not a job id (hex digits)"))
}

/// `gsm kill JOB`: kills the job's ranks on every host given; its `gsm run` then ends the job.
pub(crate) fn kill(options: &KillOptions) -> anyhow::Result<()> {
    let mut total = 0;
    for (host, reply) in ask_all(&options.daemons, &Request::KillJob(options.job))? {
        let Reply::Killed(n) = reply else {
            bail!("host {} answered a kill with {reply:?}", host.name);
        };
        println!(
            "{}: killed {n} ranks of job {:016x}",
            host.name, options.job
        );
        total += n;
    }
    if total == 0 {
        bail!("job {:016x} runs on none of these hosts", options.job);
    }
    Ok(())
}

/// Options of `gsm cluster-key`.
#[derive(clap::Args, Debug)]
pub(crate) struct KeyOptions {
    /// Where to write the new key [default: ~/.gossamer/cluster.key].
    #[arg(value_name = "FILE")]
    path: Option<PathBuf>,
}

/// `gsm cluster-key [FILE]`: writes a fresh key, never over an existing file.
pub(crate) fn make_key(options: &KeyOptions) -> anyhow::Result<()> {
    let path = match &options.path {
        Some(path) => path.clone(),
        None => {
            let dir = gossamer_dir()?;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot make {}", dir.display()))?;
            default_key()?
        }
    };
    ClusterKey::create(&path)?;
    println!(
        "wrote a new cluster key to {} (mode 0600): copy it to every host, keeping its mode; \
         whoever holds it can run code on every host",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_with_or_without_ports_and_brackets() {
        let hosts = parse_hosts("10.0.0.1, 10.0.0.2:7421,[fd00::2],[fd00::3]:9,fd00::4,localhost")
            .expect("a good list");
        let addrs: Vec<String> = hosts.iter().map(|h| h.addr.to_string()).collect();
        assert_eq!(
            addrs,
            [
                "10.0.0.1:7420",
                "10.0.0.2:7421",
                "[fd00::2]:7420",
                "[fd00::3]:9",
                "[fd00::4]:7420",
                "127.0.0.1:7420"
            ]
        );
        assert_eq!(hosts[1].name, "10.0.0.2:7421");
        let twice = parse_hosts("10.0.0.1,10.0.0.1:7420").unwrap_err();
        assert!(twice.contains("given twice"), "{twice}");
        let empty = parse_hosts("10.0.0.1,,10.0.0.2").unwrap_err();
        assert!(empty.contains("empty entry"), "{empty}");
        let port = parse_hosts("10.0.0.1:http").unwrap_err();
        assert!(
            port.contains("cannot resolve host '10.0.0.1:http'"),
            "{port}"
        );
    }
}
