"""Where grid carbon intensity comes from: the Electricity Maps, WattTime and UK Carbon Intensity clients
against recorded answers served by a real HTTP server on 127.0.0.1 (tests/data/green/), the uploaded-CSV
parser, CodeCarbon's annual country averages and the order resolve_series falls back in."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from workers.green.history import load_history
from workers.green.providers import (
    MAX_CSV_ROWS,
    UK_CARBON_INTENSITY_URL,
    WATTTIME_URL,
    ElectricityMaps,
    ProviderError,
    UKCarbonIntensity,
    WattTime,
    configured_providers,
    country_average,
    parse_forecast_csv,
    resolve_series,
)
from workers.green.series import IntensitySeries

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "green"
NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)  # the recorded answers were made "at" this time
HOUR = timedelta(hours=1)


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


class RecordedAPI:
    """A real HTTP server on 127.0.0.1: each path answers with a recorded body (or, given a list, with
    each answer in turn, the last one repeated), and every request is kept for the test to look at."""

    def __init__(self) -> None:
        self.routes: dict[str, list[tuple[int, bytes, dict, float]]] = {}
        self.requests: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                parts = urlsplit(self.path)
                api.requests.append(
                    {
                        "path": parts.path,
                        "query": {k: v[0] for k, v in parse_qs(parts.query).items()},
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                    }
                )
                answers = api.routes.get(parts.path) or [(404, b'{"error": "no recorded answer"}', {}, 0.0)]
                status, body, headers, delay = answers.pop(0) if len(answers) > 1 else answers[0]
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for key, value in {"Content-Type": "application/json", **headers}.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def serve(
        self, path: str, *answers: dict | str | bytes, status: int = 200, headers=None, delay=0.0
    ) -> None:
        """Answer ``path`` with recorded files (``name.json``), JSON objects or raw bytes."""
        self.routes[path] = [
            (
                status,
                (DATA / a).read_bytes()
                if isinstance(a, str)
                else a
                if isinstance(a, bytes)
                else json.dumps(a).encode(),
                headers or {},
                delay,
            )
            for a in answers
        ]

    def paths(self) -> list[str]:
        return [r["path"] for r in self.requests]


@pytest.fixture(scope="module")
def loopback():
    api = RecordedAPI()
    thread = threading.Thread(target=api.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield api
    api.server.shutdown()
    api.server.server_close()


@pytest.fixture
def api(loopback):
    loopback.routes.clear()
    loopback.requests.clear()
    return loopback


def electricity_maps(api: RecordedAPI, timeout: float = 2.0) -> ElectricityMaps:
    return ElectricityMaps("em-test-token", base_url=api.url + "/v3", timeout=timeout)


def watttime(api: RecordedAPI) -> WattTime:
    return WattTime("ada", "s3cret", base_url=api.url, timeout=2.0)


def uk(api: RecordedAPI) -> UKCarbonIntensity:
    return UKCarbonIntensity(base_url=api.url, timeout=2.0)


# ------------------------------------------------------------------------------------ Electricity Maps


def test_electricity_maps_history_is_measured_hourly_and_sends_the_auth_token(api):
    api.serve("/v3/carbon-intensity/history", "electricitymaps_history_DE.json")
    series = electricity_maps(api).history("DE")
    points = recorded("electricitymaps_history_DE.json")["history"]
    assert (series.provider, series.zone, series.kind) == ("electricitymaps", "DE", "actual")
    assert series.values == tuple(float(p["carbonIntensity"]) for p in points)
    assert series.start == NOW - 24 * HOUR and series.end == NOW and series.step() == HOUR
    assert "lifecycle emission factors" in series.source
    assert "2 of 24 hours estimated by Electricity Maps (TIME_SLICER_AVERAGE)" in series.source
    (request,) = api.requests
    assert request["headers"]["auth-token"] == "em-test-token"
    assert request["query"] == {"zone": "DE"}


def test_electricity_maps_forecast_is_labelled_forecast(api):
    api.serve("/v3/carbon-intensity/forecast", "electricitymaps_forecast_DE.json")
    series = electricity_maps(api).forecast("DE")
    points = recorded("electricitymaps_forecast_DE.json")["forecast"]
    assert series.kind == "forecast" and series.start == NOW and series.end == NOW + 24 * HOUR
    assert series.values == tuple(float(p["carbonIntensity"]) for p in points)
    assert api.paths() == ["/v3/carbon-intensity/forecast"]


def test_a_window_across_now_joins_measured_and_forecast_values_and_is_labelled_forecast(api):
    api.serve("/v3/carbon-intensity/history", "electricitymaps_history_DE.json")
    api.serve("/v3/carbon-intensity/forecast", "electricitymaps_forecast_DE.json")
    series = electricity_maps(api).series("DE", NOW - 2 * HOUR, NOW + 3 * HOUR, now=NOW)
    history = recorded("electricitymaps_history_DE.json")["history"]
    forecast = recorded("electricitymaps_forecast_DE.json")["forecast"]
    assert series.kind == "forecast"  # part of it is: never labelled all-measured
    assert (series.start, series.end) == (NOW - 2 * HOUR, NOW + 3 * HOUR)
    assert series.value_at(NOW - HOUR) == history[-1]["carbonIntensity"]
    assert series.value_at(NOW + HOUR) == forecast[1]["carbonIntensity"]
    assert "measured until 2026-03-10 12:00 UTC, forecast after" in series.source
    assert sorted(api.paths()) == ["/v3/carbon-intensity/forecast", "/v3/carbon-intensity/history"]


def test_a_past_window_asks_only_for_the_measured_history(api):
    api.serve("/v3/carbon-intensity/history", "electricitymaps_history_DE.json")
    series = electricity_maps(api).series("DE", NOW - 6 * HOUR, NOW - HOUR, now=NOW)
    assert series.kind == "actual" and len(series.times) == 5
    assert api.paths() == ["/v3/carbon-intensity/history"]


def test_a_window_the_answer_does_not_cover_says_what_it_covers(api):
    api.serve("/v3/carbon-intensity/history", "electricitymaps_history_DE.json")
    with pytest.raises(ProviderError) as e:
        electricity_maps(api).series("DE", NOW - 48 * HOUR, NOW - 30 * HOUR, now=NOW)
    assert (
        "covers 2026-03-09 12:00 UTC to 2026-03-10 12:00 UTC, not the requested 2026-03-08 12:00 UTC"
        in str(e.value)
    )


@pytest.mark.parametrize(
    "status, recording, expected",
    [
        (
            401,
            "electricitymaps_error_401.json",
            ["HTTP 401", "Invalid auth-token", "check ELECTRICITYMAPS_TOKEN"],
        ),
        (
            429,
            "electricitymaps_error_429.json",
            ["HTTP 429", "Too many requests", "rate limited: retry after 30 s"],
        ),
        (500, "electricitymaps_error_500.json", ["HTTP 500", "Unknown error occured", "try again later"]),
    ],
)
def test_http_errors_name_the_provider_the_status_and_its_message(api, status, recording, expected):
    api.serve("/v3/carbon-intensity/forecast", recording, status=status, headers={"Retry-After": "30"})
    with pytest.raises(ProviderError) as e:
        electricity_maps(api).forecast("DE")
    text = str(e.value)
    assert (e.value.provider, e.value.status) == ("Electricity Maps", status)
    assert text.startswith(
        f"Electricity Maps: HTTP {status} for {api.url}/v3/carbon-intensity/forecast?zone=DE: "
    )
    assert all(part in text for part in expected), text
    assert "em-test-token" not in text


@pytest.mark.parametrize(
    "body, expected",
    [
        (b"<html><body>502 Bad Gateway</body></html>", "HTTP 200 for"),
        ({"zone": "DE"}, "expected a non-empty 'history' list, got zone"),
        ({"zone": "DE", "history": []}, "expected a non-empty 'history' list"),
        (
            {"history": [{"datetime": "yesterday", "carbonIntensity": 300}]},
            "datetime 'yesterday' is not an ISO 8601",
        ),
        ({"history": [{"datetime": "2026-03-09T12:00:00.000Z", "carbonIntensity": "high"}]}, "'high' at"),
        (
            {"history": [{"datetime": "2026-03-09T12:00:00.000Z", "carbonIntensity": -5}]},
            "finite number >= 0",
        ),
        (
            {"history": [{"datetime": "2026-03-09T12:00:00.000Z", "carbonIntensity": None}]},
            "carbonIntensity null",
        ),
    ],
)
def test_malformed_answers_are_errors_that_say_what_is_wrong(api, body, expected):
    api.serve("/v3/carbon-intensity/history", body)
    with pytest.raises(ProviderError) as e:
        electricity_maps(api).history("DE")
    assert str(e.value).startswith("Electricity Maps: ") and expected in str(e.value), str(e.value)
    if isinstance(body, bytes):
        assert "the body is not JSON: '<html><body>502 Bad Gateway</body></html>'" in str(e.value)


def test_hours_without_a_value_are_counted_in_the_source(api):
    body = recorded("electricitymaps_history_DE.json")
    body["history"][5]["carbonIntensity"] = None
    api.serve("/v3/carbon-intensity/history", body)
    series = electricity_maps(api).history("DE")
    assert (
        len(series.times) == 23
        and "1 hours without a value (the hour before holds over them)" in series.source
    )


def test_a_provider_that_does_not_answer_in_time_or_at_all_is_reported(api):
    api.serve("/v3/carbon-intensity/forecast", "electricitymaps_forecast_DE.json", delay=0.6)
    with pytest.raises(
        ProviderError, match=r"no answer from .*/v3/carbon-intensity/forecast\?zone=DE within 0.2 s"
    ):
        electricity_maps(api, timeout=0.2).forecast("DE")
    with pytest.raises(
        ProviderError, match="could not reach http://127.0.0.1:1/v3/carbon-intensity/forecast"
    ):
        ElectricityMaps("t", base_url="http://127.0.0.1:1/v3", timeout=1).forecast("DE")


# -------------------------------------------------------------------------------------------- WattTime


def test_watttime_logs_in_with_basic_auth_then_sends_the_bearer_token_once_per_login(api):
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/forecast", "watttime_forecast_CAISO_NORTH.json")
    client = watttime(api)
    client.forecast("CAISO_NORTH")
    client.forecast("CAISO_NORTH")
    assert api.paths() == ["/login", "/v3/forecast", "/v3/forecast"]
    login, data = api.requests[0], api.requests[1]
    assert login["headers"]["authorization"] == "Basic " + base64.b64encode(b"ada:s3cret").decode()
    assert data["headers"]["authorization"] == "Bearer " + recorded("watttime_login.json")["token"]
    assert data["query"] == {"region": "CAISO_NORTH", "signal_type": "co2_moer"}


def test_watttime_moer_is_converted_from_lbs_per_mwh_to_grams_per_kwh_and_called_marginal(api):
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/forecast", "watttime_forecast_CAISO_NORTH.json")
    series = watttime(api).forecast("CAISO_NORTH")
    points = recorded("watttime_forecast_CAISO_NORTH.json")["data"]
    assert (series.provider, series.zone, series.kind) == ("watttime", "CAISO_NORTH", "forecast")
    assert series.values[0] == pytest.approx(950.0 * 0.453592)  # 950 lbs/MWh = 430.9 g/kWh
    assert series.values == pytest.approx([p["value"] * 0.453592 for p in points])
    assert series.step() == timedelta(minutes=5) and series.end == NOW + timedelta(minutes=5 * len(points))
    assert "MARGINAL operating emissions rate" in series.source and "not the grid's average" in series.source
    assert "lbs CO2/MWh x 0.453592 = g/kWh" in series.source and "model 2023-03-01" in series.source


def test_watttime_historical_is_measured_and_asks_for_the_window(api):
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/historical", "watttime_historical_CAISO_NORTH.json")
    series = watttime(api).series("CAISO_NORTH", NOW - 2 * HOUR, NOW, now=NOW)
    assert series.kind == "actual" and len(series.times) == 24 and series.end == NOW
    query = api.requests[-1]["query"]
    assert query == {
        "region": "CAISO_NORTH",
        "signal_type": "co2_moer",
        "start": "2026-03-10T10:00:00+00:00",
        "end": "2026-03-10T12:00:00+00:00",
    }


def test_watttime_forecast_beyond_a_day_asks_for_a_longer_horizon(api):
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/forecast", "watttime_forecast_CAISO_NORTH.json")
    with pytest.raises(
        ProviderError, match="the answer covers 2026-03-10 12:00 UTC to 2026-03-10 15:00 UTC, not"
    ):
        watttime(api).series("CAISO_NORTH", NOW, NOW + 30 * HOUR, now=NOW)
    assert api.requests[-1]["query"]["horizon_hours"] == "30"


def test_watttime_logs_in_again_once_when_a_token_is_refused(api):
    api.serve("/login", "watttime_login.json")
    api.routes["/v3/forecast"] = [
        (401, b'{"error": "Unauthorized", "message": "Token expired"}', {}, 0.0),
        (200, (DATA / "watttime_forecast_CAISO_NORTH.json").read_bytes(), {}, 0.0),
    ]
    assert watttime(api).forecast("CAISO_NORTH").kind == "forecast"
    assert api.paths() == ["/login", "/v3/forecast", "/login", "/v3/forecast"]


def test_watttime_bad_credentials_name_the_variables_and_not_the_password(api):
    api.serve("/login", "watttime_error_login_401.json", status=401)
    with pytest.raises(ProviderError) as e:
        watttime(api).forecast("CAISO_NORTH")
    text = str(e.value)
    assert text.startswith(f"WattTime: HTTP 401 for {api.url}/login: Invalid username or password")
    assert "check WATTTIME_USERNAME/WATTTIME_PASSWORD" in text and "s3cret" not in text


def test_watttime_region_outside_the_plan_is_reported_in_watttimes_words(api):
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/forecast", "watttime_error_403.json", status=403)
    with pytest.raises(ProviderError, match="HTTP 403 .*Invalid scope. You do not have sufficient access"):
        watttime(api).forecast("PJM_DC")


def test_watttime_units_other_than_lbs_per_mwh_are_refused(api):
    body = recorded("watttime_forecast_CAISO_NORTH.json")
    body["meta"]["units"] = "kg_co2_per_mwh"
    api.serve("/login", "watttime_login.json")
    api.serve("/v3/forecast", body)
    with pytest.raises(ProviderError, match="units 'kg_co2_per_mwh': expected 'lbs_co2_per_mwh'"):
        watttime(api).forecast("CAISO_NORTH")


# ---------------------------------------------------------------------------------- UK Carbon Intensity


def test_uk_forecast_is_48_hours_of_half_hours_labelled_forecast(api):
    api.serve("/intensity/2026-03-10T12:00Z/fw48h", "uk_intensity_fw48h.json")
    series = uk(api).forecast_48h(NOW)
    periods = recorded("uk_intensity_fw48h.json")["data"]
    assert (series.provider, series.zone, series.kind) == ("uk-carbon-intensity", "GB", "forecast")
    assert (
        len(series.times) == 96 and series.step() == timedelta(minutes=30) and series.end == NOW + 48 * HOUR
    )
    assert series.values == tuple(float(p["intensity"]["forecast"]) for p in periods)
    assert "national Great Britain" in series.source and "forecast for every period" in series.source


def test_uk_future_window_is_cut_from_the_48_hour_forecast(api):
    api.serve("/intensity/2026-03-10T13:00Z/fw48h", "uk_intensity_fw48h.json")
    series = uk(api).series("GB", NOW + HOUR, NOW + 5 * HOUR, now=NOW)
    assert (series.start, series.end, len(series.times)) == (NOW + HOUR, NOW + 5 * HOUR, 8)
    assert api.paths() == ["/intensity/2026-03-10T13:00Z/fw48h"]


def test_uk_past_window_where_every_period_has_an_actual_is_actual(api):
    api.serve("/intensity/2026-03-09T00:00Z/2026-03-09T06:00Z", "uk_intensity_past.json")
    start = datetime(2026, 3, 9, tzinfo=UTC)
    series = uk(api).series("gb", start, start + 6 * HOUR, now=NOW)
    periods = recorded("uk_intensity_past.json")["data"]
    assert series.kind == "actual" and "measured ('actual') for every period" in series.source
    assert series.values == tuple(float(p["intensity"]["actual"]) for p in periods)


def test_uk_mixed_answer_uses_actual_where_present_and_is_not_labelled_actual(api):
    api.serve("/intensity/2026-03-10T10:00Z/2026-03-10T14:00Z", "uk_intensity_mixed.json")
    series = uk(api).series("GB", NOW - 2 * HOUR, NOW + 2 * HOUR, now=NOW)
    periods = recorded("uk_intensity_mixed.json")["data"]
    assert series.kind == "forecast"
    assert series.values[:4] == tuple(float(p["intensity"]["actual"]) for p in periods[:4])
    assert series.values[4:] == tuple(float(p["intensity"]["forecast"]) for p in periods[4:])
    assert "measured ('actual') for 4 of 8 periods, forecast for the rest" in series.source


def test_uk_api_serves_great_britain_only():
    client = UKCarbonIntensity()
    assert client.refuses("GB") is None
    assert "national Great Britain only" in client.refuses("DE")
    with pytest.raises(ValueError, match="national Great Britain only"):
        client.series("DE", NOW, NOW + HOUR, now=NOW)


def test_uk_errors_and_empty_periods_are_reported_in_the_apis_words(api):
    api.serve("/intensity/2026-03-10T12:00Z/fw48h", "uk_error_400.json", status=400)
    with pytest.raises(
        ProviderError, match="UK Carbon Intensity API: HTTP 400 .*Please enter a valid start datetime"
    ):
        uk(api).forecast_48h(NOW)
    empty = {
        "data": [
            {
                "from": "2026-03-10T12:00Z",
                "to": "2026-03-10T12:30Z",
                "intensity": {"forecast": None, "actual": None},
            }
        ]
    }
    api.serve("/intensity/2026-03-10T12:00Z/fw48h", empty)
    with pytest.raises(ProviderError, match="from 2026-03-10T12:00Z has neither actual nor forecast"):
        uk(api).forecast_48h(NOW)


# ------------------------------------------------------------------------------------- configuration


def test_no_provider_is_on_unless_configured():
    assert configured_providers({}) == []
    assert configured_providers({"CANN_TRAIN_UK_CARBON_INTENSITY": "0", "ELECTRICITYMAPS_TOKEN": " "}) == []


def test_configured_providers_read_the_environment_and_reach_nothing(api):
    env = {
        "ELECTRICITYMAPS_TOKEN": "t",
        "ELECTRICITYMAPS_API_URL": api.url + "/v3",
        "WATTTIME_USERNAME": "ada",
        "WATTTIME_PASSWORD": "s3cret",
        "CANN_TRAIN_UK_CARBON_INTENSITY": "1",
    }
    providers = configured_providers(env)
    assert [p.name for p in providers] == ["electricitymaps", "watttime", "uk-carbon-intensity"]
    assert [p.base_url for p in providers] == [api.url + "/v3", WATTTIME_URL, UK_CARBON_INTENSITY_URL]
    assert api.requests == []


@pytest.mark.parametrize(
    "env, expected",
    [
        (
            {"WATTTIME_USERNAME": "ada"},
            "WATTTIME_USERNAME is set but WATTTIME_PASSWORD is not: set both or neither",
        ),
        (
            {"CANN_TRAIN_UK_CARBON_INTENSITY": "maybe"},
            "CANN_TRAIN_UK_CARBON_INTENSITY must be 1 or 0, got 'maybe'",
        ),
        (
            {"ELECTRICITYMAPS_TOKEN": "t", "ELECTRICITYMAPS_API_URL": "ftp://x"},
            "ELECTRICITYMAPS_API_URL must be an http",
        ),
    ],
)
def test_a_half_done_configuration_says_what_to_set(env, expected):
    with pytest.raises(ValueError) as e:
        configured_providers(env)
    assert expected in str(e.value)


# ------------------------------------------------------------------------------------------------ CSV

ROWS = "2026-03-10T12:00:00Z,200\n2026-03-10T12:30:00Z,180.5\n2026-03-10T13:00:00Z,150\n"


@pytest.mark.parametrize(
    "header",
    ["time,gco2_per_kwh", "Time,Carbon Intensity", "datetime,carbon_intensity", " DateTime , GCO2_PER_KWH "],
)
def test_csv_with_each_accepted_header_reads_the_same(header):
    series = parse_forecast_csv(f"{header}\n{ROWS}", zone="GB")
    assert (series.provider, series.zone, series.kind) == ("csv", "GB", "forecast")
    assert series.values == (200.0, 180.5, 150.0)
    assert series.start == NOW and series.end == NOW + 1.5 * HOUR
    assert "3 rows" in series.source


def test_csv_times_without_an_offset_are_utc_and_offsets_are_converted():
    series = parse_forecast_csv(
        "time,gco2_per_kwh\n2026-03-10 12:00,200\n2026-03-10T13:30:00+01:00,180\n", zone="DE"
    )
    assert series.times == (NOW, NOW + timedelta(minutes=30))


def test_csv_extra_columns_blank_lines_a_bom_and_bytes_are_accepted():
    text = "\ufeffregion,time,gco2_per_kwh,note\n\nGB,2026-03-10T12:00Z,200,a\n\nGB,2026-03-10T13:00Z,100,b\n"
    for upload in (text, text.encode("utf-8")):
        series = parse_forecast_csv(upload, zone="GB", kind="actual", source="meter.csv")
        assert (
            series.values == (200.0, 100.0)
            and series.kind == "actual"
            and series.source.startswith("meter.csv")
        )


def test_the_shipped_history_file_reads_as_an_upload_equal_to_the_history():
    text = (ROOT / "workers/green/data/carbon_intensity/gb-2020.csv").read_text()
    series = parse_forecast_csv(text, zone="GB", kind="history")
    history = load_history("GB")
    assert series.times == history.times and series.values == history.values


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "the CSV file is empty: expected a header line such as 'time,gco2_per_kwh'"),
        (" \n\n", "the CSV file is empty"),
        ("time,gco2_per_kwh\n", "the CSV file has a header (line 1) but no rows"),
        (
            "when,gco2_per_kwh\n2026-03-10T12:00Z,1\n",
            "line 1: the header must name a time column (time or datetime)",
        ),
        ("time;gco2_per_kwh\n2026-03-10T12:00Z;1\n", "(it looks separated by ';': use commas)"),
        (
            "time,gco2_per_kwh\n2026-03-10T12:00Z,200\n10/03/2026 12:30,180\n",
            "line 3: cannot read the time '10/03/2026",
        ),
        ("time,gco2_per_kwh\n2026-03-10T12:00Z,abc\n", "line 2: the intensity 'abc' is not a number"),
        ("time,gco2_per_kwh\n2026-03-10T12:00Z,-3\n", "line 2: the intensity -3 is negative"),
        ("time,gco2_per_kwh\n2026-03-10T12:00Z,nan\n", "line 2: the intensity 'nan' is not a finite number"),
        (
            "time,gco2_per_kwh\n2026-03-10T12:00Z,1\n2026-03-10T11:00Z,2\n",
            "line 3: the time 2026-03-10T11:00Z is earlier than line 2",
        ),
        (
            "time,gco2_per_kwh\n2026-03-10T12:00Z,1\n\n2026-03-10T12:00:00+00:00,2\n",
            "line 4: the time 2026-03-10T12:00:00+00:00 repeats the time of line 2",
        ),
        ("time,gco2_per_kwh\n2026-03-10T12:00Z\n", "line 2: expected 2 columns like the header, found 1"),
        (b"time,gco2_per_kwh\n\xff\n", "the CSV file is not UTF-8 text"),
    ],
)
def test_csv_errors_name_the_line_and_what_is_wrong(text, expected):
    with pytest.raises(ValueError) as e:
        parse_forecast_csv(text, zone="GB")
    assert expected in str(e.value), str(e.value)


def test_csv_with_too_many_rows_is_refused():
    assert MAX_CSV_ROWS == 200_000
    rows = "".join(f"{(NOW + i * timedelta(minutes=5)).isoformat()},100\n" for i in range(11))
    with pytest.raises(ValueError, match="line 12: more than 10 rows; split the file"):
        parse_forecast_csv("time,gco2_per_kwh\n" + rows, zone="GB", max_rows=10)
    assert len(parse_forecast_csv("time,gco2_per_kwh\n" + rows, zone="GB", max_rows=11).times) == 11


# ------------------------------------------------------------------------------------------ CodeCarbon


def codecarbon_table() -> dict:
    """CodeCarbon's country table, found through the installed distribution's file list."""
    path = importlib.metadata.distribution("codecarbon").locate_file(
        "codecarbon/data/private_infra/global_energy_mix.json"
    )
    return json.loads(Path(path).read_text())


@pytest.mark.parametrize(
    "alpha2, alpha3, low, high",  # plausibility bounds: nuclear France, coal-heavy China
    [
        ("FR", "FRA", 20, 120),
        ("DE", "DEU", 250, 500),
        ("GB", "GBR", 100, 350),
        ("US", "USA", 300, 450),
        ("CN", "CHN", 450, 700),
    ],
)
def test_codecarbon_country_averages_are_the_bundled_figures_for_a_year(alpha2, alpha3, low, high):
    row = codecarbon_table()[alpha3]
    series = country_average(alpha2)
    assert series == country_average(alpha3.lower())
    assert (series.provider, series.zone, series.kind) == ("codecarbon", alpha3, "average")
    assert series.values == (float(row["carbon_intensity"]),) and low < series.values[0] < high
    year = row["year"]
    assert (series.start, series.end) == (
        datetime(year, 1, 1, tzinfo=UTC),
        datetime(year + 1, 1, 1, tzinfo=UTC),
    )
    version = importlib.metadata.version("codecarbon")
    assert f"CodeCarbon {version} (MIT) codecarbon/data/private_infra/global_energy_mix.json" in series.source
    assert f"{row['country_name']} {year}" in series.source and "Our World in Data" in series.source


def test_codecarbon_average_from_a_given_start_lasts_a_year_and_uk_means_gb():
    series = country_average("UK", start=datetime(2024, 2, 29, tzinfo=UTC))
    assert series.zone == "GBR" and series.end == datetime(2025, 2, 28, tzinfo=UTC)


@pytest.mark.parametrize("country, hint", [("XX", ""), ("France", "did you mean FRA (France)?"), ("12", "")])
def test_an_unknown_country_says_how_to_find_valid_codes(country, hint):
    with pytest.raises(ValueError) as e:
        country_average(country)
    text = str(e.value)
    assert f"no CodeCarbon annual average for country {country!r}" in text
    assert "ISO 3166-1 alpha-2 code (FR) or alpha-3 code (FRA)" in text and "average_countries()" in text
    assert hint in text


def test_reading_codecarbons_data_does_not_import_codecarbon():
    code = (
        "import sys; from workers.green.providers import country_average; "
        "print(country_average('FR').values[0] > 0, 'codecarbon' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "False"]


# ------------------------------------------------------------------------------------------ resolution


def hourly_upload(zone: str, hours: int) -> IntensitySeries:
    rows = "".join(f"{(NOW + i * HOUR).isoformat()},{100 + i}\n" for i in range(hours))
    return parse_forecast_csv("time,gco2_per_kwh\n" + rows, zone=zone)


def test_resolve_uses_a_configured_live_provider_first(api):
    api.serve("/v3/carbon-intensity/forecast", "electricitymaps_forecast_DE.json")
    env = {"ELECTRICITYMAPS_TOKEN": "t", "ELECTRICITYMAPS_API_URL": api.url + "/v3"}
    found = resolve_series("DE", NOW, NOW + 6 * HOUR, env=env, uploaded=hourly_upload("DE", 8), now=NOW)
    series = found["series"]
    assert (series.provider, series.kind, series.start, series.end) == (
        "electricitymaps",
        "forecast",
        NOW,
        NOW + 6 * HOUR,
    )
    assert found["skipped"] == []


def test_resolve_falls_back_to_the_upload_when_the_live_provider_fails_and_says_why(api):
    api.serve("/v3/carbon-intensity/forecast", "electricitymaps_error_401.json", status=401)
    env = {"ELECTRICITYMAPS_TOKEN": "t", "ELECTRICITYMAPS_API_URL": api.url + "/v3"}
    found = resolve_series("DE", NOW, NOW + 6 * HOUR, env=env, uploaded=hourly_upload("DE", 8), now=NOW)
    assert found["series"].provider == "csv" and found["series"].values[0] == 100.0
    skipped = {s["provider"]: s["reason"] for s in found["skipped"]}
    assert list(skipped) == ["electricitymaps", "watttime", "uk-carbon-intensity"]
    assert "HTTP 401" in skipped["electricitymaps"] and "Invalid auth-token" in skipped["electricitymaps"]
    assert skipped["watttime"] == "not configured (set WATTTIME_USERNAME and WATTTIME_PASSWORD)"
    assert (
        skipped["uk-carbon-intensity"]
        == "not switched on (set CANN_TRAIN_UK_CARBON_INTENSITY=1; it needs no key)"
    )


def test_resolve_reads_an_upload_given_as_csv_text_and_refuses_a_bad_one_before_asking_anyone(api):
    text = "time,gco2_per_kwh\n2026-03-10T12:00Z,90\n2026-03-10T13:00Z,80\n"
    assert resolve_series("FR", NOW, NOW + HOUR, env={}, uploaded=text)["series"].values == (90.0,)
    env = {"CANN_TRAIN_UK_CARBON_INTENSITY": "1", "CANN_TRAIN_UK_CARBON_INTENSITY_URL": api.url}
    with pytest.raises(ValueError, match="line 1: the header must name a time column"):
        resolve_series("GB", NOW, NOW + HOUR, env=env, uploaded="when,what\n")
    assert api.requests == []


def test_history_stands_in_on_the_same_calendar_position_of_2020_and_says_so():
    found = resolve_series("GB", NOW, NOW + 6 * HOUR, env={}, uploaded=hourly_upload("GB", 2))
    series, history = found["series"], load_history("GB")
    assert (series.provider, series.kind, series.start, series.end) == (
        "history",
        "history",
        NOW,
        NOW + 6 * HOUR,
    )
    for k in range(12):
        t = NOW + k * timedelta(minutes=30)
        assert series.value_at(t) == history.value_at(t.replace(year=2020))
    assert series.source.startswith(
        "history used as a stand-in, not a forecast: GB values measured 2020-03-10 12:00 UTC"
    )
    assert "Wiesner et al." in series.source
    skipped = {s["provider"]: s["reason"] for s in found["skipped"]}
    assert list(skipped) == ["electricitymaps", "watttime", "uk-carbon-intensity", "csv"]
    assert skipped["csv"].startswith(
        "the uploaded forecast covers 2026-03-10 12:00 UTC to 2026-03-10 14:00 UTC"
    )


def test_history_inside_its_own_dates_is_used_as_measured_and_a_new_year_window_wraps():
    start = datetime(2020, 6, 1, tzinfo=UTC)
    series = resolve_series("de", start, start + 3 * HOUR, env={})["series"]
    assert series.values == load_history("DE").window(start, start + 3 * HOUR).values
    assert series.kind == "history" and "values measured in this very window" in series.source
    start = datetime(2025, 12, 31, 20, tzinfo=UTC)
    series = resolve_series("DE", start, start + 8 * HOUR, env={})["series"]
    assert series.value_at(start + 6 * HOUR) == load_history("DE").value_at(
        datetime(2021, 1, 1, 2, tzinfo=UTC)
    )


def test_the_last_resort_is_the_codecarbon_country_average(api):
    found = resolve_series("FR", NOW, NOW + 6 * HOUR, env={})
    series = found["series"]
    assert (series.provider, series.kind, series.start, series.end) == (
        "codecarbon",
        "average",
        NOW,
        NOW + 6 * HOUR,
    )
    assert series.values == country_average("FR").values
    assert found["skipped"][-1] == {
        "provider": "history",
        "reason": "no shipped history for zone 'FR' (shipped: DE, GB)",
    }


def test_a_subzone_falls_back_to_its_countrys_average_and_the_uk_api_is_asked_for_gb_only(api):
    env = {"CANN_TRAIN_UK_CARBON_INTENSITY": "1", "CANN_TRAIN_UK_CARBON_INTENSITY_URL": api.url}
    found = resolve_series("US-CAL-CISO", NOW, NOW + HOUR, env=env)
    assert found["series"].zone == "USA"
    assert found["series"].source.startswith(
        "country average standing in for zone US-CAL-CISO: annual average"
    )
    assert "national Great Britain only" in found["skipped"][2]["reason"] and api.requests == []
    api.serve("/intensity/2026-03-10T12:00Z/fw48h", "uk_intensity_fw48h.json")
    assert resolve_series("GB", NOW, NOW + HOUR, env=env, now=NOW)["series"].provider == "uk-carbon-intensity"


def test_no_source_at_all_is_a_lookup_error_naming_each_reason():
    with pytest.raises(LookupError) as e:
        resolve_series("CAISO_NORTH", NOW, NOW + HOUR, env={})
    text = str(e.value)
    assert text.startswith("no carbon-intensity series for zone CAISO_NORTH from 2026-03-10 12:00 UTC")
    for part in (
        "electricitymaps: not configured",
        "csv: no forecast was uploaded",
        "history: no shipped history",
    ):
        assert part in text
    assert "codecarbon: no CodeCarbon annual average for country 'CAISO_NORTH'" in text


def test_a_window_must_end_after_it_starts():
    with pytest.raises(ValueError, match="the window must end after it starts"):
        resolve_series("GB", NOW, NOW, env={})
