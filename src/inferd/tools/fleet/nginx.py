"""nginx's configuration for a local fleet, from the plan's routes (the same ones the Kubernetes
Ingress is made of): one upstream per route, a map from the model in `/v2/models/{m}/...` to its
upstream, and retries of a failed POST on another bin (`non_idempotent`: inference is a POST)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from inferd.tools.plan.plan_file import Route

ALL_BINS = "fleet_all"
# Triton's phrase first (clients match on it), then what is wrong; $fleet_model is nginx's variable.
UNKNOWN = '{"error": "Request for unknown model: $fleet_model is in no bin of this fleet", "code": "model_not_found"}'


def nginx_config(
    plan_routes: list[Route], ports: Mapping[str, int], listen: int, state: Path,
    endpoints: Mapping[str, list[str]] | None = None,
) -> str:  # fmt: skip
    """`ports`: each bin's HTTP port on 127.0.0.1; `state`: where nginx keeps its pid, logs, temp
    files; `endpoints`: each endpoint's bins (those holding all its variants' models)."""
    upstreams = []
    for route in plan_routes:
        upstreams.append(_upstream(_name(route.name), [ports[b] for b in route.instances]))
    upstreams.append(_upstream(ALL_BINS, sorted(ports.values())))
    entries = [f"        {_quote(m)} {_name(r.name)};" for r in plan_routes for m in r.models]
    for index, (endpoint, holders) in enumerate(sorted((endpoints or {}).items())):
        upstream = f"fleet_endpoint_{index}"  # endpoint names may hold dots, which upstream names should not
        upstreams.append(_upstream(upstream, sorted(ports[b] for b in holders)))
        entries.append(f"        {_quote(endpoint)} {upstream};")
    models = "\n".join(entries)
    logs = state / "logs"
    return f"""# Written by inferd fleet up from the plan; nginx -c this file.
daemon on;
pid {state / "nginx.pid"};
error_log {logs / "nginx-error.log"} warn;
worker_processes 1;

events {{
    worker_connections 1024;
}}

http {{
    access_log {logs / "nginx-access.log"};
    client_body_temp_path {state / "nginx-tmp" / "body"};
    proxy_temp_path {state / "nginx-tmp" / "proxy"};
    fastcgi_temp_path {state / "nginx-tmp" / "fastcgi"};
    uwsgi_temp_path {state / "nginx-tmp" / "uwsgi"};
    scgi_temp_path {state / "nginx-tmp" / "scgi"};
    client_max_body_size 64m;
    map_hash_bucket_size 128;
    map_hash_max_size 65536;

{chr(10).join(upstreams)}
    map $fleet_model $fleet_upstream {{
        default "";
{models}
    }}

    server {{
        listen 127.0.0.1:{listen};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Request-ID $request_id;
        # A bin that is down or draining: the request goes to the next bin holding the model.
        proxy_next_upstream error timeout http_502 http_503 non_idempotent;
        proxy_next_upstream_tries 2;
        proxy_connect_timeout 2s;
        proxy_read_timeout 60s;

        location ~ ^/v2/models/(?<fleet_model>[^/]+) {{
            default_type application/json;
            if ($fleet_upstream = "") {{
                return 404 '{UNKNOWN}';
            }}
            proxy_pass http://$fleet_upstream;
        }}
        # Server health, metadata and the rest: any bin.
        location / {{
            proxy_pass http://{ALL_BINS};
        }}
    }}
}}
"""


def _name(route: str) -> str:
    return "fleet_" + route.replace("-", "_")


def _upstream(name: str, ports: list[int]) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{port} max_fails=1 fail_timeout=5s;" for port in ports)
    return f"    upstream {name} {{\n{servers}\n        keepalive 16;\n    }}\n"


def _quote(model: str) -> str:
    return '"' + model.replace("\\", "\\\\").replace('"', '\\"') + '"'
