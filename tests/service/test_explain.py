"""``POST /queries/explain``: the plan and cost model of a live query, with measured counts over sample events."""
from __future__ import annotations

from tests.service.conftest import Service
from tests.service.test_api_e2e import ev, make_type


def test_explain_returns_nodes_with_estimates_and_measured_counts(service: Service, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        text = f"PATTERN SEQ({t} a, {t} b) WHERE b.price < a.price * 0.9 PARTITION BY symbol WITHIN 1 min"
        events = [ev(t, t0 + 1_000, "A", 100.0), ev(t, t0 + 2_000, "A", 80.0), ev(t, t0 + 3_000, "A", 95.0)]
        r = c.post("/queries/explain", json={"text": text, "events": events})
        assert r.status_code == 200, r.text
        body = r.json()
        node = body["plans"][0]["nodes"][1]
        assert [x["text"] for x in node["conjuncts"]] == ["b.price < a.price * 0.9"]
        # pairs (e1, e2), (e1, e3), (e2, e3): only e1 -> e2 drops by more than 10%
        assert node["measured"] == {"input": 3, "output": 1, "pass_probability": 1 / 3}
        assert body["measured_matches"] == 1
        assert node["estimate"]["cost"] > 0
        assert c.get("/queries").status_code == 200  # nothing was registered or ingested
        no_events = c.post("/queries/explain", json={"text": text, "rates": {t: 5.0}, "keys": 2}).json()
        assert no_events["stream"]["source"] == "rates" and no_events["plans"][0]["nodes"][1]["measured"] is None


def test_explain_bad_input_names_the_field(service: Service, t0: int) -> None:
    with service.client() as c:
        t = make_type(c)
        text = f"PATTERN SEQ({t} a, {t} b) WITHIN 1 min"
        r = c.post("/queries/explain", json={"text": f"PATTERN SEQ({t} a, Nope b)"})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.text"
        r = c.post("/queries/explain", json={"text": text, "events": [{"type": t, "ts": "soon"}]})
        assert r.status_code == 422 and r.json()["detail"][0]["field"].startswith("body.events[0]")
        r = c.post("/queries/explain", json={"text": text, "estimates": {"a.price > 1": 3.0}})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.estimates"
        r = c.post("/queries/explain", json={"text": text + " STRATEGY skip_till_next_match", "push_down": False})
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "body.push_down"
