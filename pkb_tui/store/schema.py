"""The one place that knows the database schema. Versioned by PRAGMA user_version.

Units are in column names; one unit per quantity: times in microseconds (_us), wall-clock moments
in Unix seconds (_at, ts), bytes (_bytes), rates in bytes per second (_bytes_per_s), bandwidths in
GB/s (10^9 bytes/s, _gbps), fractions in 0..1 (_fraction), percentages 0..100 (_pct).
A NULL means "not measured / not available", never zero.

To change the schema: append a migration (a list of statements) to MIGRATIONS; never edit one that
has shipped. Store.open applies the missing ones in one transaction each.
"""

from __future__ import annotations

from pkb_tui.store.statuses import STATUSES as RUN_STATUSES  # noqa: F401  (the one list: statuses.py)

VARIANTS = ("baseline", "candidate")


def host_pair(a: str, b: str) -> tuple[str, str]:
    """How a pair of hosts is keyed (calibrations.host_a, host_b): its two hostnames, in order."""
    return (a, b) if a <= b else (b, a)

_V1 = [
    """
    CREATE TABLE hosts (
        id INTEGER PRIMARY KEY,
        fingerprint TEXT NOT NULL UNIQUE,
        hostname TEXT NOT NULL,
        gpu_model TEXT,
        gpu_count INTEGER NOT NULL DEFAULT 0,
        driver_version TEXT,
        cuda_version TEXT,
        torch_version TEXT,
        nccl_version TEXT,
        python_version TEXT,
        topology TEXT,              -- JSON: nvidia-smi topo style matrix / links per GPU
        first_seen_at REAL NOT NULL,
        last_seen_at REAL NOT NULL
    )
    """,
    """
    CREATE TABLE calibrations (
        id INTEGER PRIMARY KEY,
        host_id INTEGER NOT NULL REFERENCES hosts(id),
        measured_at REAL NOT NULL,
        kind TEXT NOT NULL,         -- device_copy, peer_copy_engine, peer_sm, allreduce_busbw, ...
        gpu_a INTEGER,
        gpu_b INTEGER,
        size_bytes INTEGER,
        bandwidth_gbps REAL NOT NULL,
        detail TEXT                 -- JSON
    )
    """,
    "CREATE INDEX calibrations_host ON calibrations(host_id, kind, measured_at)",
    """
    CREATE TABLE sources (
        hash TEXT PRIMARY KEY,      -- sha256 of the text
        path TEXT NOT NULL,
        text TEXT NOT NULL,
        first_seen_at REAL NOT NULL
    )
    """,
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        batch_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        model TEXT NOT NULL,
        model_path TEXT,
        world_size INTEGER NOT NULL,
        mode TEXT NOT NULL,
        dtype TEXT NOT NULL,
        size TEXT NOT NULL,
        trials INTEGER NOT NULL,
        timeout_s REAL NOT NULL,
        request TEXT NOT NULL,      -- JSON of the whole request item
        status TEXT NOT NULL DEFAULT 'queued',
        status_detail TEXT,
        host_id INTEGER REFERENCES hosts(id),
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        launcher_pid INTEGER,
        launcher_host TEXT,
        log_path TEXT,
        trace_path TEXT,
        baseline_source_hash TEXT REFERENCES sources(hash),
        candidate_source_hash TEXT REFERENCES sources(hash),
        timings_representative INTEGER NOT NULL DEFAULT 1,
        mps_enabled INTEGER,
        notes TEXT                  -- JSON list of sentences shown with the result
    )
    """,
    "CREATE INDEX runs_task ON runs(task_id, model, created_at)",
    "CREATE INDEX runs_status ON runs(status)",
    "CREATE INDEX runs_created ON runs(created_at)",
    """
    CREATE TABLE results (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        variant TEXT NOT NULL,
        correct INTEGER,
        trials_passed INTEGER,
        trials_total INTEGER,
        max_abs_error REAL,
        max_rel_error REAL,
        worst_rank INTEGER,
        median_us REAL,
        p10_us REAL,
        p90_us REAL,
        mean_us REAL,
        min_us REAL,
        max_us REAL,
        iterations INTEGER,
        speedup REAL,               -- baseline median / this median (candidate row)
        bus_bandwidth_gbps REAL,
        roofline_floor_us REAL,
        roofline_fraction REAL,     -- floor / median: 1.0 means at the limit
        roofline_bound TEXT,        -- wire, memory or compute
        bandwidth_source TEXT,      -- calibrated or datasheet:<name>
        traffic TEXT,               -- JSON of the task's Traffic model
        link_bytes_per_iter REAL,   -- NVLink bytes counted by NVML per timed iteration (max rank)
        pcie_bytes_per_iter REAL,
        traffic_flag TEXT,          -- below_model / wasteful / NULL
        UNIQUE(run_id, variant)
    )
    """,
    """
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        trial INTEGER NOT NULL,     -- -1: the outputs of the timed iterations
        correct INTEGER NOT NULL,
        max_abs_error REAL,
        max_rel_error REAL,
        worst_rank INTEGER,
        message TEXT,
        detail TEXT,                -- JSON: per-rank figures
        UNIQUE(run_id, trial)
    )
    """,
    """
    CREATE TABLE kernels (
        id INTEGER PRIMARY KEY,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        variant TEXT NOT NULL,
        rank INTEGER NOT NULL,
        name TEXT NOT NULL,
        category TEXT NOT NULL,     -- communication, copy, candidate, compute, cpu_op
        calls INTEGER NOT NULL,
        total_us REAL NOT NULL,
        mean_us REAL NOT NULL,
        share_fraction REAL
    )
    """,
    "CREATE INDEX kernels_run ON kernels(run_id, variant)",
    """
    CREATE TABLE samples (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        host_id INTEGER,
        run_id INTEGER,
        gpu INTEGER NOT NULL,       -- -1: the host (CPU sampler)
        resolution TEXT NOT NULL DEFAULT 'raw',  -- raw or 1s (retention averages)
        nvlink_tx_bytes_per_s REAL,
        nvlink_rx_bytes_per_s REAL,
        pcie_tx_bytes_per_s REAL,
        pcie_rx_bytes_per_s REAL,
        sm_util_pct REAL,
        mem_util_pct REAL,
        dram_bw_util_pct REAL,
        tensor_active_pct REAL,
        power_w REAL,
        sm_clock_mhz REAL,
        mem_clock_mhz REAL,
        temperature_c REAL,
        memory_used_bytes REAL,
        cpu_pct REAL,
        host_memory_used_bytes REAL,
        loopback_bytes_per_s REAL
    )
    """,
    "CREATE INDEX samples_ts ON samples(ts)",
    "CREATE INDEX samples_run ON samples(run_id, gpu, ts)",
    """
    CREATE TABLE link_samples (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        run_id INTEGER,
        gpu INTEGER NOT NULL,
        link INTEGER NOT NULL,
        resolution TEXT NOT NULL DEFAULT 'raw',
        tx_bytes_per_s REAL,
        rx_bytes_per_s REAL
    )
    """,
    "CREATE INDEX link_samples_ts ON link_samples(ts)",
]

# v2: the run index of samples, cheaper to keep up to date. It covers only rows of a run:
# `pkb-tui monitor` rows (run_id NULL) are never read by run, and weeks of them need not update a
# second index on every insert ("run_id = ?" implies "run_id IS NOT NULL", so run reads use it).
# And it is (run_id, ts), which rows arrive in, so inserts append at its end; (run_id, gpu, ts)
# had one insertion point per GPU inside the tree and cost a third of the sink's throughput.
# A run's reads sort its rows by GPU instead (thousands of rows, once per screen).
_V2 = [
    "DROP INDEX samples_run",
    "CREATE INDEX samples_run ON samples(run_id, ts) WHERE run_id IS NOT NULL",
]

# v3: CPU use per rank process (host rows' ranks), so a run's history shows which rank was busy.
_V3 = [
    """
    CREATE TABLE rank_samples (
        id INTEGER PRIMARY KEY,
        ts REAL NOT NULL,
        run_id INTEGER,
        rank INTEGER NOT NULL,
        pid INTEGER,
        resolution TEXT NOT NULL DEFAULT 'raw',
        cpu_pct REAL              -- 100 = one full core
    )
    """,
    "CREATE INDEX rank_samples_ts ON rank_samples(ts)",
    "CREATE INDEX rank_samples_run ON rank_samples(run_id, ts) WHERE run_id IS NOT NULL",
]

# timing: eager and CUDA-graph figures per variant, the speedup's confidence interval, the number of
# interleaved rounds, whether the speedup is within the host's noise floor, the roofline's latency
# term. median_us .. max_us and speedup keep meaning "the figure the user picked" (timing_method),
# so readers that predate this keep working; eager_* / graph_* / speedup_eager* / speedup_graph*
# hold both methods whichever was picked. calibrations grow per-message latency and noise-floor
# rows (bandwidth_gbps becomes nullable: those rows have none; a table rebuild is how SQLite drops
# a NOT NULL) and the mode a figure was measured in (the noise floor of cpu mode is not nccl's).
_V_TIMING = [
    *(f"ALTER TABLE results ADD COLUMN {column}" for column in (
        "eager_median_us REAL", "eager_p10_us REAL", "eager_p90_us REAL",
        "graph_median_us REAL", "graph_p10_us REAL", "graph_p90_us REAL",
        "graph_note TEXT",  # why there is no graph figure ('not capturable: ...')
        "speedup_low REAL", "speedup_high REAL",  # the interval of speedup (the picked method)
        "speedup_eager REAL", "speedup_eager_low REAL", "speedup_eager_high REAL",
        "speedup_graph REAL", "speedup_graph_low REAL", "speedup_graph_high REAL",
        "speedup_note TEXT",                 # how the interval was made (stats.speedup_interval)
        "within_noise INTEGER",              # 1: the host's self-check spread could explain the speedup
        "noise_floor_fraction REAL",         # the floor it was judged against (0.03 = +-3%)
        "rounds INTEGER",                    # interleaved rounds timed (adaptive)
        "timing_method TEXT DEFAULT 'eager'",  # eager or graph: which figure median_us/speedup hold
        "roofline_latency_us REAL",          # the floor's latency term (alpha x messages)
    )),
    """
    CREATE TABLE calibrations_v (
        id INTEGER PRIMARY KEY,
        host_id INTEGER NOT NULL REFERENCES hosts(id),
        measured_at REAL NOT NULL,
        kind TEXT NOT NULL,         -- ... and link_latency, noise_floor
        gpu_a INTEGER,
        gpu_b INTEGER,
        size_bytes INTEGER,
        bandwidth_gbps REAL,        -- NULL for kinds that are not a bandwidth
        latency_us REAL,            -- link_latency: per-message latency (alpha)
        noise_floor_fraction REAL,  -- noise_floor: self-check spread, 0.03 = +-3%
        mode TEXT,                  -- the run mode a noise floor was measured in
        detail TEXT                 -- JSON
    )
    """,
    "INSERT INTO calibrations_v (id, host_id, measured_at, kind, gpu_a, gpu_b, size_bytes, bandwidth_gbps, detail) "
    "SELECT id, host_id, measured_at, kind, gpu_a, gpu_b, size_bytes, bandwidth_gbps, detail FROM calibrations",
    "DROP TABLE calibrations",
    "ALTER TABLE calibrations_v RENAME TO calibrations",
    "CREATE INDEX calibrations_host ON calibrations(host_id, kind, measured_at)",
]

# generate: language-model endpoints writing candidates (pkb_tui.generate). A generation run asks one
# endpoint for K samples per task and R refine rounds per sample; every request keeps its prompt
# (by hash), its reply (raw text, finish reason, usage, latency, cost), and the candidate it gave,
# linked to the run that evaluated it. Each row is written as soon as it exists, so a killed
# `generate` resumes from what is stored (`generate --resume`).
_V_GENERATE = [
    """
    CREATE TABLE gen_runs (
        id INTEGER PRIMARY KEY,
        created_at REAL NOT NULL,
        finished_at REAL,
        status TEXT NOT NULL DEFAULT 'running',  -- running, finished, stopped, error, interrupted
        status_detail TEXT,
        endpoint TEXT NOT NULL,     -- the name in models.toml
        api TEXT NOT NULL,          -- openai or anthropic
        base_url TEXT NOT NULL,
        model_id TEXT NOT NULL,     -- the model asked for
        model_slug TEXT NOT NULL,
        endpoint_config TEXT NOT NULL,  -- JSON: the endpoint without any key (only the env var's name)
        request TEXT NOT NULL,      -- JSON: tasks, samples, rounds, world_size, mode, size, dtype, trials
        out_dir TEXT NOT NULL,      -- solutions/gen/<slug>/<id>
        template_version TEXT NOT NULL,
        launcher_pid INTEGER,
        launcher_host TEXT
    )
    """,
    """
    CREATE TABLE gen_prompts (
        hash TEXT PRIMARY KEY,      -- sha256 of the JSON {system, messages}
        template TEXT NOT NULL,
        text TEXT NOT NULL,         -- that JSON
        first_seen_at REAL NOT NULL
    )
    """,
    """
    CREATE TABLE gen_requests (
        id INTEGER PRIMARY KEY,
        gen_run_id INTEGER NOT NULL REFERENCES gen_runs(id) ON DELETE CASCADE,
        task_id TEXT NOT NULL,
        sample INTEGER NOT NULL,    -- 0..K-1: independent samples
        round INTEGER NOT NULL,     -- 0: first answer; 1..R: refine rounds
        prompt_hash TEXT NOT NULL REFERENCES gen_prompts(hash),
        status TEXT NOT NULL DEFAULT 'pending',  -- pending, sent, replied, failed
        error TEXT,
        attempts INTEGER,
        retries TEXT,               -- JSON list of sentences (what failed, how long we waited)
        created_at REAL NOT NULL,
        sent_at REAL,
        finished_at REAL,
        UNIQUE(gen_run_id, task_id, sample, round)
    )
    """,
    """
    CREATE TABLE gen_replies (
        id INTEGER PRIMARY KEY,
        request_id INTEGER NOT NULL UNIQUE REFERENCES gen_requests(id) ON DELETE CASCADE,
        text TEXT NOT NULL,         -- the raw reply, whole
        finish_reason TEXT,         -- as the API said: stop, length, end_turn, max_tokens, ...
        resolved_model TEXT,        -- the model id the server says answered
        prompt_tokens INTEGER,
        completion_tokens INTEGER,
        cached_tokens INTEGER,
        reasoning_tokens INTEGER,
        latency_us REAL,
        cost_usd REAL,
        received_at REAL NOT NULL
    )
    """,
    """
    CREATE TABLE gen_candidates (
        id INTEGER PRIMARY KEY,
        request_id INTEGER NOT NULL UNIQUE REFERENCES gen_requests(id) ON DELETE CASCADE,
        gen_run_id INTEGER NOT NULL REFERENCES gen_runs(id) ON DELETE CASCADE,
        task_id TEXT NOT NULL,
        sample INTEGER NOT NULL,
        round INTEGER NOT NULL,
        path TEXT,                  -- the solution file; NULL when the reply had no code
        source_hash TEXT REFERENCES sources(hash),
        extraction TEXT NOT NULL,   -- which blocks made the code, or why there is none
        status TEXT NOT NULL,       -- pending (to evaluate), no_code, invalid, request_failed, evaluated
        detail TEXT,                -- why a candidate was not launched
        run_id INTEGER REFERENCES runs(id),  -- the run that evaluated it
        created_at REAL NOT NULL
    )
    """,
    "CREATE INDEX gen_requests_run ON gen_requests(gen_run_id, round)",
    "CREATE INDEX gen_candidates_run ON gen_candidates(gen_run_id, task_id, sample, round)",
]

# Views for reading runs.db as a data set without knowing the schema (sqlite-utils query, Datasette,
# pandas.read_sql, `pkb-tui query`, `pkb-tui export`); documented column by column in docs/database.md.
# run_results: one row per run, both variants' figures side by side (baseline_*, candidate_*).
# kernel_rows: one row per profiled kernel with its run's task, model, mode and host.
_V_VIEWS = [
    """
    CREATE VIEW run_results AS
    SELECT
        r.id AS run_id, r.batch_id, r.task_id, r.model, r.model_path, r.world_size, r.mode, r.dtype, r.size,
        r.trials, r.status, r.status_detail, r.created_at, r.started_at, r.finished_at,
        r.finished_at - r.started_at AS duration_s, r.timings_representative, r.mps_enabled,
        h.hostname, h.gpu_model, h.gpu_count, h.driver_version, h.torch_version, h.nccl_version,
        b.correct AS baseline_correct, b.median_us AS baseline_median_us, b.p10_us AS baseline_p10_us,
        b.p90_us AS baseline_p90_us, b.mean_us AS baseline_mean_us, b.min_us AS baseline_min_us,
        b.max_us AS baseline_max_us, b.iterations AS baseline_iterations,
        b.bus_bandwidth_gbps AS baseline_bus_bandwidth_gbps, b.roofline_fraction AS baseline_roofline_fraction,
        b.link_bytes_per_iter AS baseline_link_bytes_per_iter, b.pcie_bytes_per_iter AS baseline_pcie_bytes_per_iter,
        c.correct AS candidate_correct, c.trials_passed, c.trials_total, c.max_abs_error, c.max_rel_error,
        c.worst_rank, c.median_us AS candidate_median_us, c.p10_us AS candidate_p10_us,
        c.p90_us AS candidate_p90_us, c.mean_us AS candidate_mean_us, c.min_us AS candidate_min_us,
        c.max_us AS candidate_max_us, c.iterations AS candidate_iterations, c.speedup,
        c.bus_bandwidth_gbps AS candidate_bus_bandwidth_gbps, c.roofline_floor_us,
        c.roofline_fraction AS candidate_roofline_fraction, c.roofline_bound, c.bandwidth_source,
        c.link_bytes_per_iter AS candidate_link_bytes_per_iter, c.pcie_bytes_per_iter AS candidate_pcie_bytes_per_iter,
        c.traffic_flag, r.log_path, r.trace_path, r.baseline_source_hash, r.candidate_source_hash
    FROM runs r
    LEFT JOIN hosts h ON h.id = r.host_id
    LEFT JOIN results b ON b.run_id = r.id AND b.variant = 'baseline'
    LEFT JOIN results c ON c.run_id = r.id AND c.variant = 'candidate'
    """,
    """
    CREATE VIEW kernel_rows AS
    SELECT
        k.run_id, r.task_id, r.model, r.mode, r.world_size, r.dtype, r.size, r.status, r.created_at,
        h.hostname, h.gpu_model, k.variant, k.rank, k.name, k.category, k.calls, k.total_us, k.mean_us,
        k.share_fraction
    FROM kernels k
    JOIN runs r ON r.id = k.run_id
    LEFT JOIN hosts h ON h.id = r.host_id
    """,
]

# Several writers on one file (two CLI batches, the dashboard and a CLI): `batches` lists the batches
# running now, one row each while its launcher lives (removed when it ends; a row whose process is
# gone, or whose pid now names another process, is stale and ignored), so each batch can say that
# another shares the machine. `runs.item_index` is the run's place in its batch: (batch_id,
# item_index) is the run's identity across databases, which `pkb-tui import` matches a recovery
# file's runs by (importing twice changes nothing). NULL for runs from before it.
_V_BATCHES = [
    """
    CREATE TABLE batches (
        batch_id TEXT PRIMARY KEY,
        host TEXT NOT NULL,         -- socket.gethostname() of the launcher
        pid INTEGER NOT NULL,       -- the launcher's process
        pid_start_ticks INTEGER,    -- its start in /proc/<pid>/stat: a reused pid is not this batch
        started_at REAL NOT NULL,
        runs INTEGER                -- how many runs the batch planned
    )
    """,
    "ALTER TABLE runs ADD COLUMN item_index INTEGER",
    "CREATE UNIQUE INDEX runs_batch_item ON runs(batch_id, item_index) WHERE item_index IS NOT NULL",
]

# Multi-node batches (issue 16): each node's agent samples its own host; the node rank tells two
# nodes on one host (same hosts row) apart. NULL: a one-node batch or the monitor.
_V_NODES = [
    "ALTER TABLE samples ADD COLUMN node INTEGER",
    "ALTER TABLE link_samples ADD COLUMN node INTEGER",
    # what crossed to other nodes, from the host's NIC and InfiniBand counters (host rows)
    "ALTER TABLE samples ADD COLUMN nic_tx_bytes_per_s REAL",
    "ALTER TABLE samples ADD COLUMN nic_rx_bytes_per_s REAL",
]

# Wire bytes per node of a multi-node run (issue 16): per variant, a JSON list with one object per
# node: the bytes per call its GPUs' links and its NICs carried over the variant's timed blocks and
# what the traffic model says the node must move on-node and off-node (engine.nodes.node_wire);
# a figure not measured is null with the reason beside it. NULL: a one-node run.
_V_NODE_WIRE = [
    "ALTER TABLE results ADD COLUMN node_wire TEXT",
]

# The network between two hosts (issue 16, `pkb-tui calibrate --network`): a figure of a pair of
# hosts, not of one, so the pair is named in its own columns: host_a <= host_b, the hostnames the
# nodes gave (the only identity the head has for another node; hosts rows are per hardware and
# software fingerprint, so one machine can have several). host_id stays host_a's row. NULL: a
# figure of one host (every other kind).
_V_NETWORK = [
    "ALTER TABLE calibrations ADD COLUMN host_a TEXT",
    "ALTER TABLE calibrations ADD COLUMN host_b TEXT",
    "CREATE INDEX calibrations_pair ON calibrations(kind, host_a, host_b, measured_at) WHERE host_a IS NOT NULL",
]

# The host's spread between processes folded into a speedup's interval (engine.stats.widened): the
# calibrated floor the stored intervals already hold, so the verdicts do not widen them again
# (store.faster.floor_to_apply). NULL: the rounds' interval alone (rows from before, and runs on a
# host with no calibrated floor).
_V_INTERVAL_FLOOR = [
    "ALTER TABLE results ADD COLUMN interval_floor REAL",
]

MIGRATIONS: list[list[str]] = [_V1, _V2, _V3, _V_TIMING, _V_GENERATE, _V_VIEWS, _V_BATCHES, _V_NODES, _V_NODE_WIRE,
                               _V_NETWORK, _V_INTERVAL_FLOOR]
SCHEMA_VERSION = len(MIGRATIONS)
