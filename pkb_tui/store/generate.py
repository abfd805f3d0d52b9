"""The Store's reads and writes of the generation tables (schema._V_GENERATE), mixed into Store.

Every write is its own short transaction, so a `generate` killed at any point leaves every request,
reply and candidate written so far, and `generate --resume` picks up from them.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from pkb_tui.errors import PkbError

_JSON_COLUMNS = ("request", "endpoint_config", "retries")


def _decode(row: Any) -> dict[str, Any]:
    out = dict(row)
    for key in _JSON_COLUMNS:
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    return out


class GenerateStore:
    conn: Any

    def _insert(self, table: str, fields: dict[str, Any]) -> int:  # provided by Store
        raise NotImplementedError

    def transaction(self) -> Any:  # provided by Store
        raise NotImplementedError

    def _update(self, table: str, row_id: int, fields: dict[str, Any]) -> None:
        fields = {k: json.dumps(v) if k in _JSON_COLUMNS and not isinstance(v, (str, type(None))) else v
                  for k, v in fields.items()}
        sets = ", ".join(f"{k}=?" for k in fields)
        with self.transaction() as conn:
            conn.execute(f"UPDATE {table} SET {sets} WHERE id=?", (*fields.values(), row_id))

    # ----------------------------------------------------------------- generation runs
    def create_gen_run(self, fields: dict[str, Any]) -> int:
        fields = dict(fields)
        fields.setdefault("created_at", time.time())
        fields.setdefault("launcher_pid", os.getpid())
        fields.setdefault("launcher_host", socket.gethostname())
        for key in ("request", "endpoint_config"):
            if not isinstance(fields.get(key), str):
                fields[key] = json.dumps(fields[key], sort_keys=True)
        return self._insert("gen_runs", fields)

    def update_gen_run(self, gen_run_id: int, **fields: Any) -> None:
        self._update("gen_runs", gen_run_id, fields)

    def gen_run(self, gen_run_id: int) -> dict[str, Any]:
        row = self.conn.execute("SELECT * FROM gen_runs WHERE id=?", (gen_run_id,)).fetchone()
        if row is None:
            raise PkbError(f"There is no generation run {gen_run_id}; `pkb-tui generations` lists them.")
        return _decode(row)

    def gen_runs(self, *, limit: int | None = 100) -> list[dict[str, Any]]:
        """Generation runs, newest first, with their request counts and cost so far."""
        sql = (
            "SELECT g.*, COUNT(q.id) AS requests, SUM(q.status = 'replied') AS replied, "
            "SUM(q.status = 'failed') AS failed, COALESCE(SUM(p.cost_usd), 0) AS cost_usd, "
            "COALESCE(SUM(p.prompt_tokens), 0) AS prompt_tokens, COALESCE(SUM(p.completion_tokens), 0) AS completion_tokens "
            "FROM gen_runs g LEFT JOIN gen_requests q ON q.gen_run_id = g.id "
            "LEFT JOIN gen_replies p ON p.request_id = q.id GROUP BY g.id ORDER BY g.id DESC"
        )
        args: list[Any] = []
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_decode(row) for row in self.conn.execute(sql, args)]

    def recover_gen_runs(self) -> int:
        """Mark generation runs left 'running' by a process that is gone as interrupted (resumable)."""
        from pkb_tui.store.store import _pid_alive

        here = socket.gethostname()
        dead = [row["id"] for row in self.conn.execute(
            "SELECT id, launcher_pid, launcher_host FROM gen_runs WHERE status = 'running'")
            if row["launcher_host"] == here and (row["launcher_pid"] is None or not _pid_alive(row["launcher_pid"]))]
        for gen_run_id in dead:
            self.update_gen_run(gen_run_id, status="interrupted",
                                status_detail="the generating process stopped; `pkb-tui generate --resume "
                                              f"{gen_run_id}` continues it")
        return len(dead)

    # ----------------------------------------------------------------- prompts, requests, replies
    def add_prompt(self, digest: str, template: str, text: str) -> str:
        with self.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO gen_prompts (hash, template, text, first_seen_at) VALUES (?, ?, ?, ?)",
                         (digest, template, text, time.time()))
        return digest

    def prompt(self, digest: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM gen_prompts WHERE hash=?", (digest,)).fetchone()
        return dict(row) if row else None

    def ensure_gen_request(self, gen_run_id: int, task_id: str, sample: int, round_index: int, prompt_hash: str) -> int:
        """The request row for (task, sample, round), made if new; an existing one keeps its status."""
        with self.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO gen_requests (gen_run_id, task_id, sample, round, prompt_hash, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)", (gen_run_id, task_id, sample, round_index, prompt_hash, time.time()))
            row = conn.execute("SELECT id FROM gen_requests WHERE gen_run_id=? AND task_id=? AND sample=? AND round=?",
                               (gen_run_id, task_id, sample, round_index)).fetchone()
        return int(row["id"])

    def update_gen_request(self, request_id: int, **fields: Any) -> None:
        self._update("gen_requests", request_id, fields)

    def add_gen_reply(self, request_id: int, fields: dict[str, Any]) -> None:
        """The reply and the request's 'replied' status in one transaction: never one without the other."""
        fields = {**fields, "request_id": request_id}
        fields.setdefault("received_at", time.time())
        cols, marks = ", ".join(fields), ", ".join("?" for _ in fields)
        with self.transaction() as conn:
            conn.execute(f"INSERT OR REPLACE INTO gen_replies ({cols}) VALUES ({marks})", tuple(fields.values()))
            conn.execute("UPDATE gen_requests SET status='replied', error=NULL, finished_at=? WHERE id=?",
                         (fields["received_at"], request_id))

    def gen_reply(self, request_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM gen_replies WHERE request_id=?", (request_id,)).fetchone()
        return dict(row) if row else None

    # ----------------------------------------------------------------- candidates
    def add_gen_candidate(self, fields: dict[str, Any]) -> int:
        fields = dict(fields)
        fields.setdefault("created_at", time.time())
        cols, marks = ", ".join(fields), ", ".join("?" for _ in fields)
        with self.transaction() as conn:
            cur = conn.execute(f"INSERT OR REPLACE INTO gen_candidates ({cols}) VALUES ({marks})", tuple(fields.values()))
            return int(cur.lastrowid)

    def update_gen_candidate(self, candidate_id: int, **fields: Any) -> None:
        self._update("gen_candidates", candidate_id, fields)

    def gen_requests(self, gen_run_id: int) -> list[dict[str, Any]]:
        """Every request of a generation run with its reply's figures, its candidate and that candidate's
        verdict (the evaluating run's status, correctness and speedup), in (task, sample, round) order."""
        sql = (
            "SELECT q.*, p.finish_reason, p.resolved_model, p.prompt_tokens, p.completion_tokens, p.cached_tokens, "
            "p.reasoning_tokens, p.latency_us, p.cost_usd, length(p.text) AS reply_chars, "
            "c.id AS candidate_id, c.path, c.source_hash, c.extraction, c.status AS candidate_status, "
            "c.detail AS candidate_detail, c.run_id, r.status AS run_status, r.status_detail AS run_detail, "
            "res.correct AS correct, res.speedup AS speedup, res.roofline_fraction AS roofline_fraction "
            "FROM gen_requests q LEFT JOIN gen_replies p ON p.request_id = q.id "
            "LEFT JOIN gen_candidates c ON c.request_id = q.id "
            "LEFT JOIN runs r ON r.id = c.run_id "
            "LEFT JOIN results res ON res.run_id = c.run_id AND res.variant = 'candidate' "
            "WHERE q.gen_run_id = ? ORDER BY q.task_id, q.sample, q.round"
        )
        return [_decode(row) for row in self.conn.execute(sql, (gen_run_id,))]

    def gen_candidate_outcomes(self, *, gen_run_ids: list[int] | None = None) -> list[dict[str, Any]]:
        """Candidates with their verdicts and the endpoint that wrote them (for pass@k per endpoint)."""
        sql = (
            "SELECT c.gen_run_id, g.endpoint, g.model_id, c.task_id, c.sample, c.round, c.status, "
            "(res.correct = 1 AND r.status = 'passed') AS correct, res.speedup AS speedup, "
            "res.speedup_low AS speedup_low, res.rounds AS rounds, res.noise_floor_fraction AS noise_floor_fraction, "
            "res.interval_floor AS interval_floor "
            "FROM gen_candidates c JOIN gen_runs g ON g.id = c.gen_run_id "
            "LEFT JOIN runs r ON r.id = c.run_id "
            "LEFT JOIN results res ON res.run_id = c.run_id AND res.variant = 'candidate'"
        )
        args: list[Any] = []
        if gen_run_ids is not None:
            sql += f" WHERE c.gen_run_id IN ({', '.join('?' for _ in gen_run_ids)})"
            args = list(gen_run_ids)
        return [dict(row) for row in self.conn.execute(sql + " ORDER BY c.id", args)]
