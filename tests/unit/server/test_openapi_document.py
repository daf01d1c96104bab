"""The OpenAPI documents against the code: each is valid OpenAPI 3.1, and its paths and methods are
exactly the routes served: `build_router`'s on the HTTP port (`GET /v2/openapi.json`), with and
without --sagemaker, and `build_management_router`'s on the TorchServe management port
(`GET /api-description`). HEAD, which every GET route serves, is left implied."""

from __future__ import annotations

from typing import Any, cast

import pytest
from openapi_spec_validator import validate

from inferd.config.server import ServerSettings
from inferd.core.service import InferenceService
from inferd.server.app import build_management_router, build_router, route_access
from inferd.server.auth import Access, AccessPolicy, TokenSet
from inferd.server.openapi import document, management_document
from inferd.server.routes import Router


def routes_in_code(sagemaker: bool) -> dict[str, set[str]]:
    # The doors only keep the service until a request comes: none comes here.
    service = cast(InferenceService, object())
    return routes_of(build_router(service, ServerSettings(model_repository=("unused",), sagemaker=sagemaker)))


def routes_of(router: Router) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for group in router.groups:
        for route in group.routes:
            assert route.pattern not in found, f"{route.pattern} is served by two routes"
            methods = set(route.methods)
            if "HEAD" in methods:
                assert "GET" in methods, f"{route.pattern}: HEAD without GET"
                methods.discard("HEAD")
            found[route.pattern] = methods
    return found


def routes_in_document(sagemaker: bool) -> dict[str, set[str]]:
    return documented_routes(document(sagemaker_multi_model=sagemaker))


def documented_routes(built: dict[str, Any]) -> dict[str, set[str]]:
    paths: dict[str, dict[str, Any]] = built["paths"]
    return {path: {method.upper() for method in item if method != "parameters"} for path, item in paths.items()}


@pytest.mark.parametrize("sagemaker", [False, True], ids=["default", "sagemaker"])
def test_every_route_is_documented_with_its_methods_and_nothing_else(sagemaker: bool) -> None:
    in_code, documented = routes_in_code(sagemaker), routes_in_document(sagemaker)
    assert sorted(set(in_code) - set(documented)) == [], "routes the document lacks"
    assert sorted(set(documented) - set(in_code)) == [], "documented paths no route serves"
    differing = {path: (in_code[path], documented[path]) for path in in_code if in_code[path] != documented[path]}
    assert differing == {}, "(served, documented) methods"


def test_the_management_port_s_document_has_its_routes_and_is_valid() -> None:
    service = cast(InferenceService, object())
    router = build_management_router(service, ServerSettings(model_repository=("unused",)))
    built = management_document()
    assert documented_routes(built) == routes_of(router)
    validate(built)
    policy = AccessPolicy(management=None, data=TokenSet.of(["user"]))
    with_tokens = management_document(access=route_access(router), policy=policy)
    assert all(item["get"]["security"] == [{"bearer": []}] for item in with_tokens["paths"].values())


@pytest.mark.parametrize("sagemaker", [False, True], ids=["default", "sagemaker"])
def test_the_document_is_valid_openapi_3_1(sagemaker: bool) -> None:
    built = document(sagemaker_multi_model=sagemaker)
    assert built["openapi"] == "3.1.0"
    validate(built)


def test_operation_ids_are_unique() -> None:
    ids = [
        operation["operationId"]
        for item in document(sagemaker_multi_model=True)["paths"].values()
        for operation in item.values()
    ]
    assert len(ids) == len(set(ids))


def test_a_server_with_tokens_documents_which_operations_ask_for_them() -> None:
    service = cast(InferenceService, object())
    policy = AccessPolicy(management=TokenSet.of(["admin"]), data=TokenSet.of(["user"]))
    router = build_router(service, ServerSettings(model_repository=("unused",)), access=policy)
    built = document(sagemaker_multi_model=False, access=route_access(router), policy=policy)
    validate(built)
    assert built["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    kinds: dict[Access, int] = {}
    for (method, path), access in route_access(router).items():
        if method == "HEAD":
            continue
        operation = built["paths"][path][method.lower()]
        kinds[access] = kinds.get(access, 0) + 1
        if access is Access.PUBLIC:
            assert "security" not in operation and "401" not in operation["responses"], path
            continue
        assert operation["security"] == [{"bearer": []}], path
        assert "401" in operation["responses"], path
        # A management route refuses an inference token with a 403; an async submit refuses with
        # one an input location outside the roots.
        refuses = access is Access.MANAGEMENT or path.endswith("/infer_async")
        assert ("403" in operation["responses"]) == refuses, path
    # load, unload, and register and the two unregisters of system and of CUDA shared memory; the
    # endpoints' list, read, set and delete; their rollouts' start, read, promote, abort and history;
    # the list of async jobs
    assert kinds[Access.MANAGEMENT] == 18 and kinds[Access.PUBLIC] >= 4 and kinds[Access.DATA] > 20
    # Without tokens, nothing asks for one.
    assert "securitySchemes" not in document(sagemaker_multi_model=False)["components"]
