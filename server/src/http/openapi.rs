//! `GET /openapi.json`: the API description (OpenAPI 3.1), written by hand next to the types.

use axum::Json;
use serde_json::{json, Value};

pub async fn spec() -> Json<Value> {
    let error = json!({"description": "Error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let errors = json!({"400": error, "413": error, "422": error, "503": error, "504": error});
    let rerank = json!({
        "summary": "Rerank documents by P(yes) / (P(yes) + P(no))",
        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RerankRequest"}}}},
        "responses": merge(json!({"200": {"description": "Documents by relevance", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RerankResponse"}}}}}), &errors),
    });
    let ids = json!({"type": "array", "items": {"type": "integer"}});
    Json(json!({
        "openapi": "3.1.0",
        "info": {"title": "tally", "version": env!("CARGO_PKG_VERSION"), "description": "Scoring engine for decoder LLMs (SGLang /v1/score compatible)."},
        "paths": {
            "/v1/score": {"post": {
                "summary": "Probability of each label token after query + item, for every item",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreRequest"}}}},
                "responses": merge(json!({"200": {"description": "Scores", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ScoreResponse"}}}}}), &errors),
            }},
            "/v1/rerank": {"post": rerank.clone()},
            "/rerank": {"post": rerank},
            "/v1/models": {"get": {"summary": "The served model", "responses": {"200": {"description": "Model list"}}}},
            "/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "Serving"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "Text exposition format", "content": {"text/plain": {}}}}}},
        },
        "components": {"schemas": {
            "ScoreRequest": {
                "type": "object",
                "required": ["query", "items", "label_token_ids"],
                "properties": {
                    "query": {"oneOf": [{"type": "string"}, ids]},
                    "items": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "array", "items": ids}]},
                    "label_token_ids": ids,
                    "apply_softmax": {"type": "boolean", "default": false},
                    "item_first": {"type": "boolean", "default": false},
                    "model": {"type": "string"},
                },
            },
            "ScoreResponse": {
                "type": "object",
                "properties": {
                    "scores": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    "model": {"type": "string"},
                    "usage": {"$ref": "#/components/schemas/Usage"},
                    "object": {"const": "scoring"},
                },
            },
            "Usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}},
            "RerankRequest": {
                "type": "object",
                "required": ["query", "documents"],
                "properties": {
                    "query": {"type": "string"},
                    "documents": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]}},
                    "top_n": {"type": "integer"},
                    "return_documents": {"type": "boolean", "default": false},
                    "instruction": {"type": "string"},
                    "model": {"type": "string"},
                },
            },
            "RerankResponse": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "model": {"type": "string"},
                    "results": {"type": "array", "items": {"type": "object", "properties": {
                        "index": {"type": "integer"}, "relevance_score": {"type": "number"},
                        "document": {"type": "object", "properties": {"text": {"type": "string"}}},
                    }}},
                    "usage": {"type": "object", "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}},
                },
            },
            "Error": {
                "type": "object",
                "properties": {
                    "object": {"const": "error"}, "message": {"type": "string"}, "type": {"type": "string"},
                    "param": {"type": ["string", "null"]}, "code": {"type": "integer"},
                },
            },
        }},
    }))
}

fn merge(mut base: Value, extra: &Value) -> Value {
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        base.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    base
}
