// The interactive API reference at /v3/docs: Swagger UI rendering this API's own OpenAPI document. It is a
// file of its own, not an inline script, because the page's Content-Security-Policy allows scripts from this
// origin only (services/api/views/docs.py). A token typed into "Authorize" stays in the page's memory.
// Scripts marked defer run in order once the page is parsed: SwaggerUIBundle is defined and #swagger-ui exists.
"use strict";

// /v3/openapi.json, resolved against the page's own address, so that the page also works behind a path prefix.
const documentUrl = new URL("openapi.json", document.baseURI).href;

// swagger-ui-bundle, even its newest release, ships Swagger UI 4.15.5, which refuses an OpenAPI 3.1 document
// ("Unable to render this definition"): 3.1 came with Swagger UI 5. Until the page has a Swagger UI 5, it is
// handed the document labelled 3.0.3. Paths, operations, parameters, descriptions and "Try it out" work as
// they are; what 3.0 lacks (keywords beside a $ref, such as each answer's list of problem codes; const; the
// null type) is left out of the examples and schemas drawn. The document the API serves is unchanged.
function labelledOpenApi30(response) {
  if (response.url !== documentUrl || typeof response.text !== "string") return response;
  const spec = JSON.parse(response.text);
  if (typeof spec.openapi === "string" && spec.openapi.startsWith("3.1.")) spec.openapi = "3.0.3";
  response.text = JSON.stringify(spec);
  response.body = spec;
  return response;
}

window.ui = SwaggerUIBundle({
  url: documentUrl,
  dom_id: "#swagger-ui",
  deepLinking: true,
  // The default sends the document's address to validator.swagger.io and shows its badge: an external
  // origin, which the policy refuses anyway.
  validatorUrl: null,
  // ?url= and ?configUrl= are ignored: the page shows this API's document and no other.
  queryConfigEnabled: false,
  responseInterceptor: labelledOpenApi30,
});
