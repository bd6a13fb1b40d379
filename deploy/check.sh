#!/usr/bin/env bash
# Offline checks of deploy/ that need no Docker engine and no systemd (deploy/README.md, "How this was checked").
#
#   bash deploy/check.sh             # from anywhere; uses .venv/bin/python (PYTHON=... to change)
#   COMPOSE=/path/to/docker-compose bash deploy/check.sh
#
# Prints one line per check and exits 1 if any failed. Checks that need a missing tool say "skipped".
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
py="${PYTHON:-$root/.venv/bin/python}"
failed=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

ok() { printf 'ok       %s\n' "$1"; }
bad() { printf 'FAILED   %s\n' "$1"; failed=1; }
skip() { printf 'skipped  %s\n' "$1"; }
run() {  # run DESCRIPTION COMMAND...: ok/FAILED by exit status, output shown on failure only
    local what="$1" out
    shift
    if out="$("$@" 2>&1)"; then ok "$what"; else bad "$what"; printf '%s\n' "$out" | sed 's/^/         /'; fi
}

if [[ ! -x "$py" ]]; then
    echo "no Python at $py: run 'make venv' first or set PYTHON" >&2
    exit 2
fi
cd "$root" || exit 2

# ---------------------------------------------------------------- compose file
run "docker-compose.yml is valid YAML" "$py" -c 'import sys, yaml; yaml.safe_load(open(sys.argv[1]))' \
    "$here/docker-compose.yml"

compose=()
if [[ -n "${COMPOSE:-}" ]]; then
    compose=("$COMPOSE")
elif docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
fi
if ((${#compose[@]})); then
    mkdir -p "$tmp/compose"
    cp "$here/docker-compose.yml" "$here/spark-defaults.conf" "$tmp/compose/"
    sed 's/^POSTGRES_PASSWORD=$/POSTGRES_PASSWORD=check0123456789abcdef/' "$here/compose.env.example" >"$tmp/compose/.env"
    cp "$here/lace.env.example" "$tmp/compose/lace.env"
    compose_config() { (cd "$tmp/compose" && "${compose[@]}" config -q); }
    run "compose config (${compose[*]})" compose_config
    rm "$tmp/compose/.env"
    if compose_config >/dev/null 2>&1; then
        bad "compose config refuses to run without POSTGRES_PASSWORD"
    else
        ok "compose config refuses to run without POSTGRES_PASSWORD"
    fi
else
    skip "compose config (no docker compose / docker-compose; set COMPOSE=)"
fi

run "compose topology (archive at the same path in service and worker, hosts, env)" "$py" - "$here/docker-compose.yml" <<'EOF'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
s = c["services"]
assert {"lace", "postgres", "spark-master", "spark-worker"} <= set(s), sorted(s)
def target(svc, vol):
    return {v.split(":")[1] for v in s[svc]["volumes"] if v.split(":")[0] == vol}
assert target("lace", "lace-archive") == target("spark-worker", "lace-archive") == {"/var/lib/lace/archive"}
env = s["lace"]["environment"]
assert env["LACE_ARCHIVE_PATH"] == "/var/lib/lace/archive" and env["LACE_DATA_DIR"] == "/var/lib/lace"
assert env["LACE_SPARK_MASTER"] == "spark://spark-master:7077"
assert "@postgres:5432/" in env["LACE_DATABASE_URL"]
assert "spark.driver.host=lace" in env["LACE_SPARK_CONF"] and s["lace"]["hostname"] == "lace"
# Executors and the driver reach each other by the advertised names: they must be compose service names.
worker = s["spark-worker"]["command"]
assert worker[worker.index("--host") + 1] == "spark-worker" and "spark://spark-master:7077" in worker
master = s["spark-master"]["command"]
assert master[master.index("--host") + 1] == "spark-master"
for name in ("lace", "postgres", "spark-master", "spark-worker"):
    assert s[name].get("restart") == "unless-stopped" and "healthcheck" in s[name], name
EOF

# ---------------------------------------------------------------- Dockerfile
run "every COPY source of the Dockerfile exists" "$py" - "$here/Dockerfile" <<'EOF'
import shlex, sys
from pathlib import Path
text = Path(sys.argv[1]).read_text().replace("\\\n", " ")
missing = []
for line in text.splitlines():
    words = shlex.split(line.strip(), comments=True) if line.strip().upper().startswith("COPY ") else []
    if not words or any(w.startswith("--from") for w in words):
        continue
    args = [w for w in words[1:] if not w.startswith("--")]
    missing += [src for src in args[:-1] if not Path(src).exists()]
assert not missing, missing
EOF

run "the Dockerfile copies every package pyproject.toml installs (lace's entry point is cli.main)" "$py" - \
    "$here/Dockerfile" "$root/pyproject.toml" <<'EOF'
import re, sys, tomllib
from pathlib import Path
text = Path(sys.argv[1]).read_text()
include = tomllib.loads(Path(sys.argv[2]).read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
packages = [p.rstrip("*") for p in include]
copied = set(re.findall(r"^COPY (\S+) /opt/lace/src/\1$", text, re.M))
missing = [p for p in packages if p not in copied]
assert not missing, f"not copied into the image: {missing}"
EOF

run "every build argument of the compose file is an ARG of the Dockerfile" "$py" - "$here/Dockerfile" \
    "$here/docker-compose.yml" <<'EOF'
import re, sys, yaml
from pathlib import Path
declared = set(re.findall(r"^ARG\s+([A-Za-z_][A-Za-z0-9_]*)", Path(sys.argv[1]).read_text(), re.M))
passed = set(yaml.safe_load(open(sys.argv[2]))["services"]["lace"]["build"]["args"])
assert passed <= declared, f"not declared in the Dockerfile: {sorted(passed - declared)}"
EOF

# ---------------------------------------------------------------- env example
run "lace.env.example documents exactly the LACE_* variables the code reads" "$py" - "$here/lace.env.example" <<'EOF'
import re, sys
from pathlib import Path
from service.core.config import Settings
read = {f"LACE_{name.upper()}" for name in Settings.model_fields}
for source in Path("archive").glob("*.py"):  # the archive's own settings, read where Spark starts or reads
    read |= set(re.findall(r'env\.get\("(LACE_[A-Z0-9_]+)"', source.read_text()))
read.add("LACE_ENV_FILE")
documented = set(re.findall(r"^#?(LACE_[A-Z0-9_]+)=", Path(sys.argv[1]).read_text(), re.M))
assert read - documented == set(), f"not documented: {sorted(read - documented)}"
assert documented - read == set(), f"documented but never read: {sorted(documented - read)}"
EOF

run "every value in lace.env.example is accepted (commented examples one by one)" "$py" - "$here/lace.env.example" <<'EOF'
import os, re, secrets, sys
from pathlib import Path
from service.core.config import Settings
from archive.spark import SparkSettings, build_conf
for key in [k for k in os.environ if k.startswith("LACE_")]:
    del os.environ[key]
active, examples = {}, []
for line in Path(sys.argv[1]).read_text().splitlines():
    m = re.match(r"^(#?)(LACE_[A-Z0-9_]+)=(.*)$", line)
    if not m or m.group(2) == "LACE_ENV_FILE":
        continue
    value = m.group(3).strip().strip('"')
    (examples.append((m.group(2), value)) if m.group(1) else active.__setitem__(m.group(2), value))
assert active.get("LACE_SECRET_KEY") == "changeme", "the placeholder must be one the service refuses"
try:
    os.environ.update(active)
    Settings(_env_file=None)
    raise AssertionError("the changeme placeholder was accepted")
except ValueError:
    pass
active["LACE_SECRET_KEY"] = secrets.token_urlsafe(48)
for key, value in [(None, None)] + examples:
    env = dict(active)
    if key is not None:
        env[key] = value if value or key in ("LACE_SPARK_CONF", "LACE_DELTA_JAR") else secrets.token_urlsafe(48)
    for k in [k for k in os.environ if k.startswith("LACE_")]:
        del os.environ[k]
    os.environ.update(env)
    Settings(_env_file=None)
    build_conf(SparkSettings.from_env(env))
EOF

# ---------------------------------------------------------------- spark-defaults.conf
run "spark-defaults.conf: key/value lines, UTC, Delta lines commented" "$py" - "$here/spark-defaults.conf" <<'EOF'
import re, sys
conf = {}
for n, line in enumerate(open(sys.argv[1]), 1):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    m = re.fullmatch(r"(spark\.[A-Za-z0-9_.]+)\s+(\S.*)", line)
    assert m, f"line {n}: {line!r}"
    assert m.group(1) not in conf, f"line {n}: {m.group(1)} twice"
    conf[m.group(1)] = m.group(2)
assert conf["spark.sql.session.timeZone"] == "UTC"
for side in ("driver", "executor"):
    assert "-Duser.timezone=UTC" in conf[f"spark.{side}.extraJavaOptions"]
assert conf["spark.hadoop.parquet.filter.dictionary.enabled"] == "false"
assert int(conf["spark.sql.sources.parallelPartitionDiscovery.threshold"]) >= 10_000
active_delta = {"spark.jars", "spark.sql.extensions", "spark.sql.catalog.spark_catalog"} & set(conf)
assert not active_delta, f"must stay commented (every query fails without the JAR): {active_delta}"
EOF

# ---------------------------------------------------------------- systemd unit
if command -v systemd-analyze >/dev/null 2>&1; then
    lace_bin="$(dirname "$py")/lace"
    if [[ -x "$lace_bin" ]]; then
        # verify needs ExecStart to exist: check a copy that points at this checkout's lace.
        sed "s|/opt/lace/venv/bin/lace|$lace_bin|" "$here/lace.service" >"$tmp/lace.service"
        run "systemd-analyze verify lace.service" systemd-analyze verify "$tmp/lace.service"
    else
        skip "systemd-analyze verify (no $lace_bin)"
    fi
else
    skip "systemd-analyze verify (not installed)"
fi
if grep -q '^MemoryDenyWriteExecute=' "$here/lace.service"; then
    bad "lace.service must not set MemoryDenyWriteExecute= (the JVM's JIT)"
else
    ok "lace.service leaves MemoryDenyWriteExecute= unset"
fi

# ---------------------------------------------------------------- Delta connector fetcher
# fetch_delta_jars.py without network: everything up to the point where it would run mvn.
run "fetch_delta_jars.py doctests" "$py" -m doctest "$here/fetch_delta_jars.py"
run "fetch_delta_jars.py --print-folder: .jars/<artifact>-<version> of the pins, where archive/spark.py looks" \
    "$py" - "$here/fetch_delta_jars.py" <<'EOF'
import subprocess, sys, tomllib
from importlib import metadata
from pathlib import Path
from archive.spark import JARS_DIR, SCALA
pins = dict(d.split("==") for d in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"])
spark_minor = ".".join(pins["pyspark"].split(".")[:2])
expected = Path.cwd() / ".jars" / f"delta-spark_{spark_minor}_2.13-{pins['delta-spark']}"
r = subprocess.run([sys.executable, sys.argv[1], "--print-folder"], capture_output=True, text=True)
assert r.returncode == 0 and r.stdout == f"{expected}\n" and not r.stderr, r
spark, delta = metadata.version("pyspark"), metadata.version("delta-spark")
default = JARS_DIR / f"delta-spark_{'.'.join(spark.split('.')[:2])}_{SCALA}-{delta}"
assert default == expected, f"archive/spark.py looks in {default} (installed versions), the pins name {expected}"
EOF
run "fetch_delta_jars.py fails in one line: no delta-spark pin, no mvn on PATH (exit 1); --optional: exit 0" \
    "$py" - "$here/fetch_delta_jars.py" "$tmp/delta" <<'EOF'
import subprocess, sys
from pathlib import Path
script, tmp = sys.argv[1], Path(sys.argv[2])
tmp.mkdir()
def fetch(*args, path="/nonexistent"):  # the absolute interpreter path: no PATH lookup needed
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env={"PATH": path})
nopin = tmp / "pyproject.toml"
nopin.write_text('[project]\nname = "x"\ndependencies = ["pyspark==4.2.0", "delta-spark>=4.4"]\n')
r = fetch("--pyproject", str(nopin), "--print-folder")
assert r.returncode == 1 and not r.stdout, r
assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "delta-spark" in r.stderr, r.stderr
out = tmp / "jars"
r = fetch("--out", str(out))
last = r.stderr.splitlines()[-1]
assert r.returncode == 1 and not r.stdout and last.startswith("error: mvn is not on PATH"), r
assert not out.exists(), "a failed fetch left its output folder"
r = fetch("--out", str(out), "--optional")
last = r.stderr.splitlines()[-1]
assert r.returncode == 0 and not r.stdout and last.startswith("warning: mvn is not on PATH"), r
assert "filelist reader" in last and not out.exists(), r
EOF
run "fetch_delta_jars.py: a folder whose .complete names the pinned artifact is done, without mvn" \
    "$py" - "$here/fetch_delta_jars.py" "$tmp/delta-complete" <<'EOF'
import subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]).parent))
from fetch_delta_jars import artifact_for
artifact, version = artifact_for(Path("pyproject.toml"))
out = Path(sys.argv[2])
out.mkdir()
def fetch():  # no mvn on PATH: exit 0 only when the marker is taken as complete
    return subprocess.run([sys.executable, sys.argv[1], "--out", str(out)], capture_output=True, text=True,
                          env={"PATH": "/nonexistent"})
(out / ".complete").write_text(f"io.delta:{artifact}:{version}\n")
r = fetch()
assert r.returncode == 0 and r.stdout == f"{out}\n" and not r.stderr, r
(out / ".complete").write_text(f"io.delta:{artifact}:0.0.1\n")
r = fetch()
assert r.returncode == 1 and "mvn is not on PATH" in r.stderr, f"another version's marker was taken as complete: {r}"
EOF

# ---------------------------------------------------------------- pins
run "constraints.txt agrees with the pins of pyproject.toml" "$py" - "$here/constraints.txt" <<'EOF'
import re, sys, tomllib
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
pins = {}
for line in open(sys.argv[1]):
    if "==" in line and not line.startswith("#"):
        name, version = line.strip().split("==")
        pins[norm(name)] = version
wrong = []
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    name, version = dep.split("==")
    name = norm(name.split("[")[0])
    if pins.get(name) != version:
        wrong.append(f"{name}: pyproject {version}, constraints {pins.get(name)}")
assert not wrong, wrong
EOF

# ---------------------------------------------------------------- shell
run "bash -n check.sh" bash -n "$here/check.sh"
if command -v shellcheck >/dev/null 2>&1; then
    run "shellcheck check.sh" shellcheck "$here/check.sh"
else
    skip "shellcheck (not installed)"
fi

exit "$failed"
