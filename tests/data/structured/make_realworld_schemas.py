"""Writes realworld_schemas.json: >= 200 JSON Schemas in real-world shapes for the structured-output
tests (tests/python/test_structured_v4.py) and bench/structured.py. Hand-written here (not copied):
 - "suite":  small schemas shaped like the JSON-Schema-Test-Suite's valid cases, keyword by keyword;
 - "tool":   function-calling / API request-response schemas (OpenAI-style tool parameters);
 - "nested": deeper objects and arrays of objects;
 - "recursive": $ref / $defs recursion (trees, lists, expressions, menus, comments).
Only keywords the engine supports (README "Structured outputs"). Run: python make_realworld_schemas.py"""
import json
from pathlib import Path

S = []


def add(cat, name, schema):
    S.append({"name": f"{cat}/{name}", "category": cat, "schema": schema})


def s(maxlen=None, **kw):
    d = {"type": "string"}
    if maxlen is not None:
        d["maxLength"] = maxlen
    d.update(kw)
    return d


def obj(props, required=None, additional=None, **kw):
    d = {"type": "object", "properties": props}
    if required is not None:
        d["required"] = required
    if additional is not None:
        d["additionalProperties"] = additional
    d.update(kw)
    return d


def arr(items, lo=None, hi=None, **kw):
    d = {"type": "array", "items": items}
    if lo is not None:
        d["minItems"] = lo
    if hi is not None:
        d["maxItems"] = hi
    d.update(kw)
    return d


I = {"type": "integer"}
B = {"type": "boolean"}
N = {"type": "number"}
NULL = {"type": "null"}

# ---------------------------------------------------------------- suite (test-suite valid-case shapes)
for t in ["integer", "number", "string", "boolean", "null", "object", "array"]:
    add("suite", f"type-{t}", {"type": t} if t not in ("string", "object", "array") else
        {"type": t, **({"maxLength": 16} if t == "string" else {}),
         **({"maxItems": 4, "items": {"type": "integer"}} if t == "array" else {}),
         **({"properties": {"foo": I, "bar": s(8)}} if t == "object" else {})})
for ts in [["integer", "string"], ["number", "null"], ["boolean", "null"], ["integer", "boolean", "null"],
           ["array", "object"], ["string", "null"]]:
    add("suite", "type-multiple-" + "-".join(ts), {"type": ts, "maxLength": 10, "maxItems": 3,
                                                   "items": I, "properties": {"a": B}})
for lo, hi in [(0, 10), (-5, 5), (1, 1), (100, 999), (-1000, -1), (0, 65535), (1, 12), (1900, 2100)]:
    add("suite", f"integer-{lo}-{hi}", {"type": "integer", "minimum": lo, "maximum": hi})
for lo in [0, 1, -2, 10]:
    add("suite", f"integer-min-{lo}", {"type": "integer", "minimum": lo, "maximum": lo + 500000})
add("suite", "integer-exclusive", {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100})
add("suite", "integer-exclusive-neg", {"type": "integer", "exclusiveMinimum": -50, "exclusiveMaximum": -10})
for lo, hi in [(0, 1), (-1, 1), (-180, 180), (0, 100), (-273, 1000)]:
    add("suite", f"number-{lo}-{hi}", {"type": "number", "minimum": lo, "maximum": hi})
add("suite", "number-exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})
for lo, hi in [(0, 0), (1, 3), (2, 2), (0, 5), (3, 12), (8, 8)]:
    add("suite", f"string-length-{lo}-{hi}", {"type": "string", "minLength": lo, "maxLength": hi})
for fmt in ["date", "time", "date-time", "uuid", "email", "ipv4"]:
    add("suite", f"format-{fmt}", {"type": "string", "format": fmt})
for i, p in enumerate([r"^a*$", r"^[a-z]+$", r"^\d{3}-\d{3}-\d{4}$", r"^[A-Z]{2}[0-9]{2}$", r"^(red|green|blue)$",
                       r"^#[0-9a-fA-F]{6}$", r"^v\d+\.\d+\.\d+$", r"^[a-z0-9_]{3,16}$", r"^\+?[1-9]\d{1,14}$",
                       r"^[A-Z][a-z]+( [A-Z][a-z]+)*$", r"^(https?)://[a-z0-9.-]+\.[a-z]{2,6}(/[a-z0-9_-]*)*$",
                       r"^[0-9]{5}(-[0-9]{4})?$"]):
    add("suite", f"pattern-{i}", {"type": "string", "pattern": p})
for i, e in enumerate([["foo", "bar"], [1, 2, 3], [True, False, None], ["a", 1, None, {"x": 1}, [1, 2]],
                       ["", "\"quoted\"", "tab\there", "ü", "日本"], [0.5, -1.25, 1e3]]):
    add("suite", f"enum-{i}", {"enum": e})
for i, c in enumerate(["fixed", 42, None, {"a": [1, {"b": "c"}]}, [True, "x"], -0.5]):
    add("suite", f"const-{i}", {"const": c})
for lo, hi in [(0, 0), (1, 1), (2, 4), (0, 6), (3, 3)]:
    add("suite", f"items-{lo}-{hi}", arr(I, lo, hi))
add("suite", "items-bool-schema-false", {"type": "array", "items": False})
add("suite", "items-object", arr(obj({"foo": I}, ["foo"]), 0, 3))
add("suite", "items-nested-arrays", arr(arr(arr(B, 0, 2), 0, 2), 0, 2))
add("suite", "prefixItems-2", {"type": "array", "prefixItems": [I, s(5)], "items": False})
add("suite", "prefixItems-open", {"type": "array", "prefixItems": [B, NULL], "items": I, "maxItems": 4})
add("suite", "prefixItems-min", {"type": "array", "prefixItems": [I, I, I], "items": False, "minItems": 3})
add("suite", "items-array-draft7", {"type": "array", "items": [s(3), I], "additionalItems": B, "maxItems": 4, "$schema": "http://json-schema.org/draft-07/schema#"})
add("suite", "required-basic", obj({"foo": I, "bar": s(6)}, ["foo"], False))
add("suite", "required-all", obj({"a": I, "b": B, "c": NULL}, ["a", "b", "c"], False))
add("suite", "required-none", obj({"a": I, "b": B}, []))
add("suite", "required-escaped-names", obj({"foo\nbar": I, "foo\"bar": I, "foo\\bar": I, "foo\tbar": I},
                                          ["foo\nbar", "foo\"bar", "foo\\bar", "foo\tbar"]))
add("suite", "required-unicode-names", obj({"名前": s(6), "größe": I, "émoji😀": B}, ["名前", "größe", "émoji😀"]))
add("suite", "additionalProperties-schema", obj({"foo": I}, ["foo"], B, ))
add("suite", "additionalProperties-true", {"type": "object", "properties": {"id": I}, "required": ["id"],
                                            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}})
add("suite", "anyOf-basic", {"anyOf": [I, {"type": "string", "maxLength": 4}]})
add("suite", "anyOf-objects", {"anyOf": [obj({"foo": I}, ["foo"]), obj({"bar": s(3)}, ["bar"])]})
add("suite", "anyOf-nested", {"anyOf": [{"anyOf": [NULL, B]}, {"anyOf": [I, N]}]})
add("suite", "oneOf-basic", {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                       {"type": "string", "pattern": "^[a-z]{2}$"}]})
add("suite", "oneOf-tagged", {"oneOf": [obj({"k": {"const": "a"}, "x": I}, ["k", "x"]),
                                        obj({"k": {"const": "b"}, "y": B}, ["k", "y"])]})
add("suite", "allOf-merge", {"allOf": [obj({"a": I}, ["a"]), obj({"b": s(4)}, ["b"])]})
add("suite", "allOf-three", {"allOf": [{"type": "object"}, obj({"x": B}, ["x"]), obj({"y": NULL}, ["y"])]})
add("suite", "ref-defs", {"$defs": {"pos": {"type": "integer", "minimum": 0, "maximum": 99}},
                          "type": "array", "items": {"$ref": "#/$defs/pos"}, "maxItems": 4})
add("suite", "ref-definitions", {"definitions": {"a": I, "b": {"$ref": "#/definitions/a"}},
                                 "type": "object", "properties": {"x": {"$ref": "#/definitions/b"}}, "required": ["x"]})
add("suite", "ref-properties-pointer", {"type": "object", "properties": {"foo": I, "bar": {"$ref": "#/properties/foo"}},
                                        "required": ["foo", "bar"]})
add("suite", "boolean-schema-true", True)
add("suite", "empty-schema-in-object", obj({"any": {}}, ["any"]))
add("suite", "null-or-object", {"type": ["object", "null"], "properties": {"n": I}})

# ---------------------------------------------------------------- tool (API / function-calling)
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}
CITY = s(24, description="City name")
tools = {
    "get_weather": obj({"location": CITY, "unit": UNIT}, ["location"], False),
    "get_forecast": obj({"location": CITY, "days": {"type": "integer", "minimum": 1, "maximum": 14}, "unit": UNIT},
                        ["location", "days"], False),
    "search_web": obj({"query": s(64), "num_results": {"type": "integer", "minimum": 1, "maximum": 20},
                       "safe_search": B}, ["query"], False),
    "send_email": obj({"to": arr({"type": "string", "format": "email"}, 1, 3), "subject": s(40), "body": s(120),
                       "cc": arr({"type": "string", "format": "email"}, 0, 2)}, ["to", "subject", "body"], False),
    "create_calendar_event": obj({"title": s(40), "start": {"type": "string", "format": "date-time"},
                                  "end": {"type": "string", "format": "date-time"},
                                  "attendees": arr({"type": "string", "format": "email"}, 0, 4),
                                  "location": s(30), "all_day": B}, ["title", "start", "end"], False),
    "book_flight": obj({"origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
                        "date": {"type": "string", "format": "date"}, "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                        "cabin": {"enum": ["economy", "premium_economy", "business", "first"]}},
                       ["origin", "destination", "date"], False),
    "get_stock_price": obj({"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}, "exchange": {"enum": ["NYSE", "NASDAQ", "LSE", "TSE"]}},
                           ["ticker"], False),
    "convert_currency": obj({"amount": {"type": "number", "minimum": 0, "maximum": 1000000}, "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                             "to": {"type": "string", "pattern": "^[A-Z]{3}$"}}, ["amount", "from", "to"], False),
    "run_sql": obj({"database": {"enum": ["prod", "staging", "analytics"]}, "query": s(200), "timeout_s": {"type": "integer", "minimum": 1, "maximum": 300}},
                   ["database", "query"], False),
    "read_file": obj({"path": s(80), "encoding": {"enum": ["utf-8", "latin-1", "binary"]}, "max_bytes": {"type": "integer", "minimum": 1, "maximum": 1048576}},
                     ["path"], False),
    "write_file": obj({"path": s(80), "content": s(200), "append": B}, ["path", "content"], False),
    "list_directory": obj({"path": s(80), "recursive": B, "pattern": s(20)}, ["path"], False),
    "execute_python": obj({"code": s(300), "timeout": {"type": "number", "minimum": 0, "maximum": 60}}, ["code"], False),
    "http_request": obj({"method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]}, "url": {"type": "string", "pattern": r"^https://[a-z0-9.-]+(/[a-zA-Z0-9_./-]*)?$"},
                         "headers": {"type": "object", "additionalProperties": s(40)}, "body": {"type": ["string", "null"], "maxLength": 100}},
                        ["method", "url"], False),
    "create_github_issue": obj({"owner": s(20), "repo": s(30), "title": s(60), "body": s(200),
                                "labels": arr(s(16), 0, 5), "assignees": arr(s(16), 0, 3)}, ["owner", "repo", "title"], False),
    "update_ticket": obj({"ticket_id": {"type": "integer", "minimum": 1, "maximum": 9999999}, "status": {"enum": ["open", "pending", "resolved", "closed"]},
                          "priority": {"enum": ["low", "normal", "high", "urgent"]}, "comment": s(120)}, ["ticket_id"], False),
    "set_thermostat": obj({"room": {"enum": ["living_room", "bedroom", "kitchen", "office"]}, "temperature": {"type": "number", "minimum": 10, "maximum": 30},
                           "mode": {"enum": ["heat", "cool", "auto", "off"]}}, ["room", "temperature"], False),
    "play_music": obj({"query": s(50), "shuffle": B, "volume": {"type": "integer", "minimum": 0, "maximum": 100}}, ["query"], False),
    "translate": obj({"text": s(150), "source_lang": {"type": "string", "pattern": "^[a-z]{2}$"}, "target_lang": {"type": "string", "pattern": "^[a-z]{2}$"}},
                     ["text", "target_lang"], False),
    "get_user": obj({"user_id": {"type": "string", "format": "uuid"}, "fields": arr({"enum": ["name", "email", "created_at", "plan"]}, 0, 4)}, ["user_id"], False),
    "geocode": obj({"address": s(80), "country": {"type": "string", "pattern": "^[A-Z]{2}$"}}, ["address"], False),
    "calculate_route": obj({"waypoints": arr({"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                                                            "lon": {"type": "number", "minimum": -180, "maximum": 180}},
                                           "required": ["lat", "lon"], "additionalProperties": False}, 2, 5),
                            "mode": {"enum": ["driving", "walking", "cycling", "transit"]}, "avoid_tolls": B}, ["waypoints"], False),
    "create_invoice": obj({"customer_id": s(12), "currency": {"enum": ["USD", "EUR", "GBP", "JPY"]}, "due_date": {"type": "string", "format": "date"},
                           "lines": arr(obj({"description": s(40), "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
                                             "unit_price": {"type": "number", "minimum": 0, "maximum": 100000}}, ["description", "quantity", "unit_price"], False), 1, 4)},
                          ["customer_id", "currency", "lines"], False),
    "schedule_meeting": obj({"participants": arr({"type": "string", "format": "email"}, 1, 5), "duration_minutes": {"enum": [15, 30, 45, 60, 90]},
                             "earliest": {"type": "string", "format": "date-time"}, "timezone": s(32)}, ["participants", "duration_minutes"], False),
    "kubectl_scale": obj({"namespace": {"type": "string", "pattern": "^[a-z0-9-]{1,30}$"}, "deployment": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
                          "replicas": {"type": "integer", "minimum": 0, "maximum": 100}}, ["deployment", "replicas"], False),
    "send_slack_message": obj({"channel": {"type": "string", "pattern": "^#[a-z0-9_-]{1,21}$"}, "text": s(200), "thread_ts": {"type": ["string", "null"], "pattern": r"^\d{10}\.\d{6}$"}},
                              ["channel", "text"], False),
    "add_todo": obj({"title": s(60), "due": {"type": ["string", "null"], "format": "date"}, "priority": {"type": "integer", "minimum": 1, "maximum": 4},
                     "tags": arr(s(12), 0, 4)}, ["title"], False),
    "image_generate": obj({"prompt": s(200), "size": {"enum": ["256x256", "512x512", "1024x1024"]}, "n": {"type": "integer", "minimum": 1, "maximum": 4},
                           "style": {"enum": ["vivid", "natural"]}}, ["prompt"], False),
    "lookup_order": obj({"order_id": {"type": "string", "pattern": "^ORD-[0-9]{8}$"}, "include_items": B}, ["order_id"], False),
    "refund_payment": obj({"payment_id": {"type": "string", "pattern": "^pi_[A-Za-z0-9]{14}$"}, "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10000000},
                           "reason": {"enum": ["duplicate", "fraudulent", "requested_by_customer"]}}, ["payment_id"], False),
}
for name, params in tools.items():
    add("tool", f"{name}-params", params)
# The same tools in a tool-call envelope ({"name": ..., "arguments": ...}), and a few multi-tool unions.
names = list(tools)
for name in names[:16]:
    add("tool", f"{name}-call", obj({"name": {"const": name}, "arguments": tools[name]}, ["name", "arguments"], False))
for k in range(6):
    group = names[k * 4:(k + 1) * 4]
    add("tool", f"union-{k}", {"anyOf": [obj({"name": {"const": n}, "arguments": tools[n]}, ["name", "arguments"], False) for n in group]})
add("tool", "parallel-calls", obj({"tool_calls": arr({"anyOf": [obj({"name": {"const": n}, "arguments": tools[n]}, ["name", "arguments"], False)
                                                             for n in ["get_weather", "get_stock_price", "lookup_order"]]}, 1, 3)},
                                  ["tool_calls"], False))
add("tool", "chat-response", obj({"id": {"type": "string", "pattern": "^chatcmpl-[A-Za-z0-9]{10}$"}, "object": {"const": "chat.completion"},
                                  "created": {"type": "integer", "minimum": 1600000000, "maximum": 1999999999},
                                  "choices": arr(obj({"index": {"type": "integer", "minimum": 0, "maximum": 3},
                                                      "finish_reason": {"enum": ["stop", "length", "tool_calls"]},
                                                      "message": obj({"role": {"const": "assistant"}, "content": {"type": ["string", "null"], "maxLength": 60}},
                                                                     ["role", "content"], False)}, ["index", "finish_reason", "message"], False), 1, 2),
                                  "usage": obj({"prompt_tokens": {"type": "integer", "minimum": 0, "maximum": 100000},
                                                "completion_tokens": {"type": "integer", "minimum": 0, "maximum": 100000}}, ["prompt_tokens", "completion_tokens"], False)},
                                 ["id", "object", "created", "choices"], False))
add("tool", "error-response", obj({"error": obj({"code": {"type": "integer", "minimum": 400, "maximum": 599}, "message": s(80),
                                                 "details": arr(obj({"field": s(20), "issue": s(40)}, ["field", "issue"], False), 0, 3)},
                                                ["code", "message"], False)}, ["error"], False))
add("tool", "pagination", obj({"items": arr(obj({"id": {"type": "string", "format": "uuid"}, "name": s(20)}, ["id", "name"], False), 0, 3),
                               "next_cursor": {"type": ["string", "null"], "pattern": "^[A-Za-z0-9]{16}$"}, "total": {"type": "integer", "minimum": 0, "maximum": 100000}},
                              ["items", "next_cursor"], False))
add("tool", "webhook-event", obj({"event": {"enum": ["push", "pull_request", "issues", "release"]}, "delivery": {"type": "string", "format": "uuid"},
                                  "timestamp": {"type": "string", "format": "date-time"},
                                  "sender": obj({"login": {"type": "string", "pattern": "^[a-z0-9-]{1,39}$"}, "id": {"type": "integer", "minimum": 1, "maximum": 999999999}},
                                                ["login", "id"], False)}, ["event", "delivery", "sender"], False))
add("tool", "sentiment", obj({"sentiment": {"enum": ["positive", "negative", "neutral", "mixed"]}, "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                              "aspects": arr(obj({"aspect": s(20), "polarity": {"enum": ["positive", "negative", "neutral"]}}, ["aspect", "polarity"], False), 0, 4)},
                             ["sentiment", "confidence"], False))
add("tool", "entity-extraction", obj({"entities": arr(obj({"text": s(30), "type": {"enum": ["PERSON", "ORG", "LOC", "DATE", "MONEY"]},
                                                           "start": {"type": "integer", "minimum": 0, "maximum": 10000},
                                                           "end": {"type": "integer", "minimum": 0, "maximum": 10000}}, ["text", "type"], False), 0, 5)},
                                     ["entities"], False))
add("tool", "classification", obj({"label": {"enum": ["spam", "ham"]}, "reasons": arr(s(50), 1, 3)}, ["label", "reasons"], False))
add("tool", "json-mode-object", {"type": "object", "properties": {"answer": s(100), "sources": arr({"type": "string", "pattern": r"^https://[a-z]+\.[a-z]{2,3}/[a-z0-9]{1,10}$"}, 0, 3)},
                                 "required": ["answer"], "additionalProperties": False})

# ---------------------------------------------------------------- nested
ADDRESS = obj({"street": s(40), "city": s(20), "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"}, "country": {"type": "string", "pattern": "^[A-Z]{2}$"}},
              ["street", "city", "country"], False)
PERSON = obj({"first_name": s(16), "last_name": s(16), "age": {"type": "integer", "minimum": 0, "maximum": 130}, "email": {"type": "string", "format": "email"},
              "address": ADDRESS}, ["first_name", "last_name"], False)
add("nested", "person", PERSON)
add("nested", "people", arr(PERSON, 1, 3))
add("nested", "company", obj({"name": s(30), "founded": {"type": "integer", "minimum": 1800, "maximum": 2025}, "hq": ADDRESS,
                              "employees": arr(PERSON, 0, 2), "public": B}, ["name", "hq"], False))
add("nested", "order", obj({"order_id": {"type": "string", "format": "uuid"}, "customer": PERSON,
                            "items": arr(obj({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                                              "price": {"type": "number", "minimum": 0, "maximum": 10000}}, ["sku", "qty", "price"], False), 1, 4),
                            "shipping": obj({"method": {"enum": ["standard", "express", "overnight"]}, "address": ADDRESS}, ["method", "address"], False),
                            "status": {"enum": ["new", "paid", "shipped", "delivered", "cancelled"]}}, ["order_id", "customer", "items", "status"], False))
add("nested", "package-json", obj({"name": {"type": "string", "pattern": "^[a-z0-9-]{1,30}$"}, "version": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                                   "private": B, "scripts": {"type": "object", "additionalProperties": s(40)},
                                   "dependencies": {"type": "object", "additionalProperties": {"type": "string", "pattern": r"^\^?\d+\.\d+\.\d+$"}}},
                                  ["name", "version"], False))
add("nested", "geojson-point", obj({"type": {"const": "Feature"}, "geometry": obj({"type": {"const": "Point"},
                                                                                   "coordinates": {"type": "array", "prefixItems": [{"type": "number", "minimum": -180, "maximum": 180}, {"type": "number", "minimum": -90, "maximum": 90}], "items": False, "minItems": 2}},
                                                                                  ["type", "coordinates"], False),
                                    "properties": obj({"name": s(20)}, [], False)}, ["type", "geometry", "properties"], False))
add("nested", "geojson-linestring", obj({"type": {"const": "LineString"}, "coordinates": arr({"type": "array", "prefixItems": [{"type": "number", "minimum": -180, "maximum": 180}, {"type": "number", "minimum": -90, "maximum": 90}], "items": False, "minItems": 2}, 2, 4)},
                                        ["type", "coordinates"], False))
add("nested", "matrix", arr(arr({"type": "integer", "minimum": -9, "maximum": 9}, 3, 3), 3, 3))
add("nested", "recipe", obj({"title": s(30), "servings": {"type": "integer", "minimum": 1, "maximum": 12},
                             "ingredients": arr(obj({"name": s(20), "amount": {"type": "number", "minimum": 0, "maximum": 1000}, "unit": {"enum": ["g", "kg", "ml", "l", "tsp", "tbsp", "cup", "piece"]}},
                                                    ["name", "amount", "unit"], False), 1, 5),
                             "steps": arr(s(60), 1, 4)}, ["title", "ingredients", "steps"], False))
add("nested", "config", obj({"server": obj({"host": s(30), "port": {"type": "integer", "minimum": 1, "maximum": 65535}, "tls": obj({"enabled": B, "cert_path": s(40)}, ["enabled"], False)}, ["host", "port"], False),
                             "logging": obj({"level": {"enum": ["debug", "info", "warning", "error"]}, "format": {"enum": ["json", "text"]}}, ["level"], False),
                             "features": {"type": "object", "additionalProperties": B}}, ["server"], False))
add("nested", "resume", obj({"name": s(30), "contact": obj({"email": {"type": "string", "format": "email"}, "phone": {"type": "string", "pattern": r"^\+[1-9][0-9]{7,12}$"}}, ["email"], False),
                             "experience": arr(obj({"company": s(20), "role": s(20), "start": {"type": "string", "format": "date"}, "end": {"type": ["string", "null"], "format": "date"},
                                                    "highlights": arr(s(40), 0, 3)}, ["company", "role", "start"], False), 0, 3),
                             "skills": arr(s(15), 0, 6)}, ["name", "contact"], False))
add("nested", "survey", obj({"respondent": {"type": "string", "format": "uuid"}, "answers": arr({"oneOf": [
    obj({"q": {"type": "integer", "minimum": 1, "maximum": 20}, "choice": {"enum": ["a", "b", "c", "d"]}}, ["q", "choice"], False),
    obj({"q": {"type": "integer", "minimum": 1, "maximum": 20}, "rating": {"type": "integer", "minimum": 1, "maximum": 5}}, ["q", "rating"], False),
    obj({"q": {"type": "integer", "minimum": 1, "maximum": 20}, "text": s(50)}, ["q", "text"], False)]}, 1, 5)}, ["respondent", "answers"], False))
add("nested", "deep-5", obj({"a": obj({"b": obj({"c": obj({"d": obj({"e": {"type": "integer", "minimum": 0, "maximum": 9}}, ["e"], False)}, ["d"], False)}, ["c"], False)}, ["b"], False)}, ["a"], False))
add("nested", "table", obj({"columns": arr(obj({"name": {"type": "string", "pattern": "^[a-z_]{1,12}$"}, "dtype": {"enum": ["int", "float", "str", "bool", "date"]}}, ["name", "dtype"], False), 1, 4),
                            "rows": arr(arr({"type": ["integer", "string", "boolean", "null"], "maxLength": 8, "minimum": -1000, "maximum": 1000}, 1, 4), 0, 3)}, ["columns", "rows"], False))
add("nested", "calendar", obj({"events": arr(obj({"id": {"type": "string", "format": "uuid"}, "title": s(30), "when": obj({"start": {"type": "string", "format": "date-time"}, "end": {"type": "string", "format": "date-time"}}, ["start", "end"], False),
                                                  "recurrence": {"anyOf": [NULL, obj({"freq": {"enum": ["DAILY", "WEEKLY", "MONTHLY"]}, "count": {"type": "integer", "minimum": 1, "maximum": 52}}, ["freq"], False)]}},
                                                 ["id", "title", "when"], False), 0, 3)}, ["events"], False))
add("nested", "log-record", obj({"ts": {"type": "string", "format": "date-time"}, "level": {"enum": ["DEBUG", "INFO", "WARN", "ERROR"]}, "msg": s(80),
                                 "ctx": {"type": "object", "additionalProperties": {"type": ["string", "integer", "boolean"], "maxLength": 20}},
                                 "client_ip": {"type": "string", "format": "ipv4"}}, ["ts", "level", "msg"], False))
add("nested", "openapi-param", obj({"name": s(20), "in": {"enum": ["query", "header", "path", "cookie"]}, "required": B,
                                    "schema": obj({"type": {"enum": ["string", "integer", "boolean", "number"]}, "default": {"type": ["string", "integer", "boolean", "null"], "maxLength": 10}}, ["type"], False)},
                                   ["name", "in"], False))
add("nested", "product-catalog", arr(obj({"id": {"type": "integer", "minimum": 1, "maximum": 100000}, "title": s(30), "price": obj({"amount": {"type": "number", "minimum": 0, "maximum": 10000}, "currency": {"enum": ["USD", "EUR"]}}, ["amount", "currency"], False),
                                          "variants": arr(obj({"color": {"enum": ["red", "black", "white"]}, "size": {"enum": ["S", "M", "L", "XL"]}, "stock": {"type": "integer", "minimum": 0, "maximum": 500}}, ["color", "size", "stock"], False), 0, 3)},
                                         ["id", "title", "price"], False), 1, 3))
add("nested", "quiz", obj({"questions": arr(obj({"prompt": s(60), "options": arr(s(20), 2, 4), "answer": {"type": "integer", "minimum": 0, "maximum": 3}}, ["prompt", "options", "answer"], False), 1, 3)}, ["questions"], False))
add("nested", "weather-report", obj({"location": obj({"name": s(20), "lat": {"type": "number", "minimum": -90, "maximum": 90}, "lon": {"type": "number", "minimum": -180, "maximum": 180}}, ["name"], False),
                                     "current": obj({"temp_c": {"type": "number", "minimum": -90, "maximum": 60}, "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "fog"]}, "humidity": {"type": "integer", "minimum": 0, "maximum": 100}}, ["temp_c", "condition"], False),
                                     "hourly": arr(obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "temp_c": {"type": "number", "minimum": -90, "maximum": 60}}, ["hour", "temp_c"], False), 0, 4)},
                                    ["location", "current"], False))
for depth in range(2, 7):
    sch = {"type": "integer", "minimum": 0, "maximum": 9}
    for d in range(depth):
        sch = arr(sch, 1, 2) if d % 2 == 0 else obj({f"k{d}": sch, "tag": s(6)}, [f"k{d}"], False)
    add("nested", f"alternating-depth-{depth}", sch)
add("nested", "flexible-json-object-values", {"type": "object", "properties": {"meta": {"type": "object", "additionalProperties": {"type": ["integer", "boolean", "null"]}}}, "required": ["meta"], "additionalProperties": False})

# ---------------------------------------------------------------- recursive
add("recursive", "linked-list", {"$defs": {"node": obj({"value": {"type": "integer", "minimum": 0, "maximum": 99}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, NULL]}}, ["value", "next"], False)},
                                 "$ref": "#/$defs/node"})
add("recursive", "binary-tree", {"$defs": {"tree": {"anyOf": [NULL, obj({"key": {"type": "integer", "minimum": 0, "maximum": 999}, "left": {"$ref": "#/$defs/tree"}, "right": {"$ref": "#/$defs/tree"}}, ["key", "left", "right"], False)]}},
                                 "$ref": "#/$defs/tree"})
add("recursive", "nary-tree-root-ref", obj({"name": s(8), "children": arr({"$ref": "#"}, 0, 3)}, ["name", "children"], False))
add("recursive", "file-system", {"$defs": {"entry": {"oneOf": [
    obj({"type": {"const": "file"}, "name": {"type": "string", "pattern": r"^[a-z0-9_]{1,12}\.[a-z]{1,4}$"}, "size": {"type": "integer", "minimum": 0, "maximum": 1000000}}, ["type", "name", "size"], False),
    obj({"type": {"const": "dir"}, "name": {"type": "string", "pattern": "^[a-z0-9_]{1,12}$"}, "entries": arr({"$ref": "#/$defs/entry"}, 0, 3)}, ["type", "name", "entries"], False)]}},
    "$ref": "#/$defs/entry"})
add("recursive", "expression", {"$defs": {"expr": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100},
                                                              obj({"op": {"enum": ["+", "-", "*", "/"]}, "args": arr({"$ref": "#/$defs/expr"}, 2, 2)}, ["op", "args"], False),
                                                              obj({"var": {"type": "string", "pattern": "^[a-z]$"}}, ["var"], False)]}},
                                "$ref": "#/$defs/expr"})
add("recursive", "comment-thread", {"$defs": {"comment": obj({"author": {"type": "string", "pattern": "^@[a-z]{1,10}$"}, "text": s(40), "replies": arr({"$ref": "#/$defs/comment"}, 0, 2)}, ["author", "text", "replies"], False)},
                                    "type": "object", "properties": {"post_id": {"type": "integer", "minimum": 1, "maximum": 99999}, "comments": arr({"$ref": "#/$defs/comment"}, 0, 2)},
                                    "required": ["post_id", "comments"], "additionalProperties": False})
add("recursive", "menu", {"definitions": {"item": obj({"label": s(16), "action": {"type": ["string", "null"], "pattern": "^[a-z_]{1,16}$"}, "submenu": arr({"$ref": "#/definitions/item"}, 0, 3)}, ["label"], False)},
                          "type": "array", "items": {"$ref": "#/definitions/item"}, "minItems": 1, "maxItems": 3})
add("recursive", "json-value-limited", {"$defs": {"v": {"anyOf": [NULL, B, {"type": "integer", "minimum": -99, "maximum": 99}, s(6), arr({"$ref": "#/$defs/v"}, 0, 3),
                                                                   {"type": "object", "properties": {"k": {"$ref": "#/$defs/v"}, "m": {"$ref": "#/$defs/v"}}}]}},
                                        "$ref": "#/$defs/v"})
add("recursive", "org-chart", {"$defs": {"emp": obj({"name": s(16), "title": {"enum": ["CEO", "VP", "Director", "Manager", "Engineer"]}, "reports": arr({"$ref": "#/$defs/emp"}, 0, 3)}, ["name", "title", "reports"], False)},
                               "$ref": "#/$defs/emp"})
add("recursive", "boolean-query", {"$defs": {"q": {"oneOf": [obj({"term": obj({"field": {"enum": ["title", "body", "author"]}, "value": s(12)}, ["field", "value"], False)}, ["term"], False),
                                                            obj({"and": arr({"$ref": "#/$defs/q"}, 2, 3)}, ["and"], False),
                                                            obj({"or": arr({"$ref": "#/$defs/q"}, 2, 3)}, ["or"], False),
                                                            obj({"not": {"$ref": "#/$defs/q"}}, ["not"], False)]}},
                                   "$ref": "#/$defs/q"})
add("recursive", "html-ast", {"$defs": {"node": {"anyOf": [s(20), obj({"tag": {"enum": ["div", "span", "p", "ul", "li", "a", "b"]}, "attrs": {"type": "object", "additionalProperties": s(12)},
                                                                      "children": arr({"$ref": "#/$defs/node"}, 0, 3)}, ["tag", "children"], False)]}},
                              "$ref": "#/$defs/node"})
add("recursive", "category-taxonomy", obj({"id": {"type": "integer", "minimum": 1, "maximum": 9999}, "name": s(20), "subcategories": arr({"$ref": "#"}, 0, 2)}, ["id", "name"], False))
add("recursive", "mutual-recursion", {"$defs": {"a": obj({"b": {"anyOf": [{"$ref": "#/$defs/b"}, NULL]}}, ["b"], False),
                                                "b": obj({"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer", "minimum": 0, "maximum": 9}]}}, ["a"], False)},
                                      "$ref": "#/$defs/a"})
add("recursive", "graph-adjacency", {"$defs": {"node": obj({"id": {"type": "string", "pattern": "^n[0-9]{1,3}$"}, "edges": arr(obj({"to": {"$ref": "#/$defs/node"}, "weight": {"type": "number", "minimum": 0, "maximum": 1}}, ["to"], False), 0, 2)}, ["id", "edges"], False)},
                                     "$ref": "#/$defs/node"})
add("recursive", "linked-list-definitions", {"definitions": {"cell": {"type": "array", "prefixItems": [s(4), {"anyOf": [{"$ref": "#/definitions/cell"}, NULL]}], "items": False, "minItems": 2}},
                                             "$ref": "#/definitions/cell"})
add("recursive", "tool-plan", {"$defs": {"step": obj({"tool": {"enum": ["search", "read", "write", "run"]}, "input": s(30), "then": arr({"$ref": "#/$defs/step"}, 0, 2)}, ["tool", "input"], False)},
                               "type": "object", "properties": {"goal": s(40), "plan": arr({"$ref": "#/$defs/step"}, 1, 3)}, "required": ["goal", "plan"], "additionalProperties": False})
for k in range(1, 6):
    add("recursive", f"tree-fanout-{k}", {"$defs": {"t": obj({"v": {"type": "integer", "minimum": 0, "maximum": k * 10}, "kids": arr({"$ref": "#/$defs/t"}, 0, k)}, ["v", "kids"], False)},
                                          "$ref": "#/$defs/t"})

# The same schemas where free text is unbounded (description-style strings) ...
unbounded = []
for e in S:
    if e["category"] == "tool" and e["name"].endswith("-params") and len(unbounded) < 12:
        sch = json.loads(json.dumps(e["schema"]))
        for p in sch["properties"].values():
            if p.get("type") == "string" and "maxLength" in p:
                del p["maxLength"]
        unbounded.append(("tool", e["name"].split("/")[1].replace("-params", "-unbounded"), sch))
for c, n, sch in unbounded:
    add(c, n, sch)

if __name__ == "__main__":
    names = [e["name"] for e in S]
    assert len(set(names)) == len(names), "duplicate names"
    out = Path(__file__).with_name("realworld_schemas.json")
    out.write_text(json.dumps(S, indent=None, ensure_ascii=False).replace('}, {"name"', '},\n{"name"') + "\n")
    from collections import Counter
    print(len(S), Counter(e["category"] for e in S))
