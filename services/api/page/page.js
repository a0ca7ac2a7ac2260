// The page of chatexport (docs/api.md: Web page). It talks to the API with fetch only: the token
// pasted in lives in this script's memory and travels in the Authorization header, never in a URL; the
// event stream is read with fetch; a result is fetched and saved as a blob. Everything shown is set as
// text (textContent), never parsed as HTML.
"use strict";

let token = null;
const watched = new Map();
// Requests that were refused with a 401 after sign-in wait here for the next token the user pastes.
let waitingForToken = [];
// The conversations' list: what the search box holds, and the cursor of the next page.
let conversationSearch = "";
let conversationsCursor = null;
// Schedules are read again this often while the page is open, so next and last runs stay current.
const SCHEDULES_REFRESH_MS = 30000;
const MIB = 1024 * 1024;
// A problem's field (the last name of an error's loc) -> the input of the export form it is about.
const EXPORT_FIELDS = {
  format: "export-format", since: "export-since", until: "export-until", senders: "export-senders",
  max_part_bytes: "export-split", notify: "export-notify", url: "export-notify", after_seq: "export-incremental",
  cid: "export-conversation", compression: "export-gzip", media: "export-media", media_types: "export-media",
};
const SCHEDULE_FIELDS = { every: "schedule-every", start_at: "schedule-start", cid: "schedule-conversation" };
const EVERY_WORDS = { PT1H: "hour", P1D: "day", P1W: "week", P1M: "month" };
// Why a schedule is paused, in words (docs/api.md: Export schedules).
const PAUSED_WHY = {
  USER: "paused by you", ACCESS_REVOKED: "paused: you are no longer a member", RUN_NEEDS_REPAIR: "paused: a run needs an operator",
};
// A sender id as the API takes it (docs/api.md: Submitting an export, Export options).
const SENDER_ID = /^[A-Za-z0-9_.:-]{1,64}$/;
const MIN_SPLIT_MIB = 5;
// Event streams open at once: a browser keeps six HTTP/1.1 connections to one origin, and the page needs some
// for everything else; the exports beyond these are polled.
const MAX_STREAMS = 3;
let streams = 0;
// A search answered after a newer one started is dropped: only the newest fills the list.
let conversationsRequest = 0;
let refreshing = null;

function element(tag, text, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  return node;
}

function button(text, className, label, onClick) {
  const node = element("button", text, { type: "button", class: className, "aria-label": label });
  node.addEventListener("click", () => Promise.resolve().then(onClick).catch((error) => say(error.message)));
  return node;
}

// Re-render ``row`` with ``draw`` and give the focus back to the button of the same kind when it was in the
// row (or to ``fallback`` when that button is gone, a Cancel once the export ended).
function keepingFocus(row, draw, fallback) {
  const active = document.activeElement;
  const kind = active && row.contains(active) && active.tagName === "BUTTON" ? active.className : null;
  draw();
  if (!kind) return;
  const same = row.querySelector("button." + CSS.escape(kind.split(" ")[0]));
  (same || row.querySelector("button") || fallback).focus();
}

// Say what an action did in the page's status line, and beside where it was started (``near``: the id of a
// form's own status line), which may be far from the top.
function say(text, near) {
  document.getElementById("message").textContent = text;
  for (const status of document.querySelectorAll(".form-status")) status.textContent = "";
  if (near) document.getElementById(near).textContent = text;
}

function signedIn() {
  return !document.getElementById("signed-in").hidden;
}

// Sizes and times in human units; the exact value is the element's title, shown on hover.
function humanBytes(bytes) {
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return (unit === 0 ? String(value) : value.toFixed(value < 10 ? 1 : 0)) + " " + units[unit];
}

function sizeCell(bytes, parts) {
  if (bytes === null || bytes === undefined) return element("td", "");
  const text = humanBytes(bytes) + (parts ? " in " + plural(parts, "part") : "");
  return element("td", text, { title: bytes.toLocaleString("en") + " bytes" });
}

function humanTime(text) {
  return new Date(text).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

function timeCell(text, className) {
  if (!text) return element("td", "none", { class: className || "" });
  return element("td", humanTime(text), { title: text, class: className || "" });
}

function plural(count, word) {
  return count.toLocaleString("en") + " " + word + (count === 1 ? "" : "s");
}

// The user's offset from UTC now, as RFC 3339 writes it (+01:00).
function offsetOf(date) {
  const minutes = -date.getTimezoneOffset();
  const sign = minutes >= 0 ? "+" : "-";
  const hours = String(Math.floor(Math.abs(minutes) / 60)).padStart(2, "0");
  return sign + hours + ":" + String(Math.abs(minutes) % 60).padStart(2, "0");
}

// A datetime-local value, in the user's time zone, as an RFC 3339 instant with that zone's offset then: the
// instant the browser reads it as (a time skipped by a clock change reads as the one after it), written in
// local time with its offset; a zone whose offset is not whole minutes (old local mean times) in UTC.
function withOffset(value) {
  if (!value) return null;
  const date = new Date(value.length === 16 ? value + ":00" : value);
  if (Number.isNaN(date.getTime())) return null;
  if (!Number.isInteger(date.getTimezoneOffset())) return date.toISOString();
  const two = (n) => String(n).padStart(2, "0");
  return date.getFullYear() + "-" + two(date.getMonth() + 1) + "-" + two(date.getDate()) + "T"
    + two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds()) + offsetOf(date);
}

function showTimeZone() {
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "your time zone";
  document.getElementById("time-zone").textContent =
    "Times are in your time zone, " + zone + " (UTC" + offsetOf(new Date()) + ").";
}

// A token refused after sign-in (it expired, or the identity provider rotated its key): ask for a new one and
// keep everything as it is; the refused request is sent again with it.
function askForToken() {
  say("Your token was refused (it may have expired). Paste a new one and choose Use token to go on.");
  document.getElementById("sign-in").hidden = false;
  document.getElementById("token").focus();
  return new Promise((resolve) => waitingForToken.push(resolve));
}

// A form field the page itself refuses before asking the API: shown beside the field like a problem's error.
class FieldError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

// A 404 for the conversation a form names: said in a user's words beside its field.
function notAMember(error, cid, field) {
  if (!(error instanceof Problem) || error.problem.code !== "NOT_FOUND") return error;
  return new FieldError(field, "You are not a member of a conversation called \u201c" + cid + "\u201d, or there is none.");
}

// ``retryAfter``: the seconds a 429's Retry-After asks for (0 without one).
class Problem extends Error {
  constructor(problem, response) {
    super((problem.detail || problem.title || "The request was refused.") + " (" + problem.code + ")");
    this.problem = problem;
    this.retryAfter = response && response.status === 429 ? Number(response.headers.get("Retry-After")) || 0 : 0;
  }
}

// Seconds until every policy the answer's RateLimit field shows spent (r=0) gives requests back: the largest t;
// 0 when none is (docs/api.md: Rate limits). Only what the page needs of the Structured Field: members that are
// a "name" with ;key=value parameters, r and t Integers; anything else is skipped.
function renewalSeconds(response) {
  let seconds = 0;
  for (const member of (response.headers.get("RateLimit") || "").split(",")) {
    const [name, ...parameters] = member.split(";");
    if (!/^\s*"[^"\\]*"\s*$/.test(name)) continue;
    const integers = {};
    for (const parameter of parameters) {
      const integer = /^\s*([a-z*][a-z0-9_.*-]*)=(\d+)\s*$/.exec(parameter);
      if (integer) integers[integer[1]] = Number(integer[2]);
    }
    if (integers.r === 0 && integers.t !== undefined) seconds = Math.max(seconds, integers.t);
  }
  return seconds;
}

// A wait the API asks for, with up to a quarter more so that pages refused together come back apart.
function jittered(seconds) {
  return seconds * (1 + Math.random() / 4);
}

function sleep(seconds) {
  return new Promise((resolve) => setTimeout(resolve, 1000 * seconds));
}

async function call(path, options) {
  const init = Object.assign({}, options || {});
  const sent = token;
  init.headers = Object.assign({}, init.headers || {}, { Authorization: "Bearer " + sent });
  let response = await fetch(path, init);
  if (response.status === 401 && signedIn()) {
    if (token === sent) await askForToken();
    init.headers.Authorization = "Bearer " + token;
    response = await fetch(path, init);
  }
  // A 304 answers only a request that sent If-None-Match, and the caller keeps what it showed.
  if (!response.ok && response.status !== 304) {
    let problem = { code: "HTTP_" + response.status, detail: response.statusText };
    try { problem = await response.json(); } catch (ignored) { /* not a problem body */ }
    throw new Problem(problem, response);
  }
  return response;
}

function postJson(path, body, key) {
  const headers = { "Content-Type": "application/json" };
  if (key) headers["Idempotency-Key"] = key;
  return call(path, { method: "POST", headers, body: JSON.stringify(body) });
}

// A problem's errors beside the fields they are about (``fields``: loc name -> input id); the rest, and the
// problem's own words, in the page's message.
function showProblem(error, fields, form, near) {
  for (const node of form.querySelectorAll(".field-error")) node.textContent = "";
  for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
  if (error instanceof FieldError) {
    document.getElementById(error.field + "-error").textContent = error.message;
    document.getElementById(error.field).setAttribute("aria-invalid", "true");
    document.getElementById(error.field).focus();
    say(error.message, near);
    return;
  }
  if (!(error instanceof Problem)) { say(error.message, near); return; }
  const unplaced = [];
  for (const item of error.problem.errors || []) {
    const names = (item.loc || []).filter((part) => typeof part === "string" && part in fields);
    const id = names.length ? fields[names[names.length - 1]] : null;
    if (!id) { unplaced.push(item.msg); continue; }
    document.getElementById(id + "-error").textContent = item.msg;
    document.getElementById(id).setAttribute("aria-invalid", "true");
  }
  say(error.message + (unplaced.length ? " (" + unplaced.join("; ") + ")" : ""), near);
  const first = form.querySelector("[aria-invalid]");
  if (first) first.focus();
}

function clearProblem(form) {
  for (const node of form.querySelectorAll(".field-error")) node.textContent = "";
  for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
}

// ---- Conversations -------------------------------------------------------------------------------------

async function loadConversations(more) {
  const body = document.querySelector("#conversations tbody");
  const request = ++conversationsRequest;
  const query = new URLSearchParams({ limit: "50" });
  if (conversationSearch) query.set("q", conversationSearch);
  if (more && conversationsCursor) query.set("cursor", conversationsCursor);
  const page = await (await call("/v2/conversations?" + query)).json();
  if (request !== conversationsRequest) return;  // a newer search or page is on its way
  if (!more) body.replaceChildren();
  for (const conversation of page.conversations) {
    const cid = conversation.conversation_id;
    const row = element("tr", null, { "data-cid": cid });
    const actions = element("td");
    actions.append(
      button("Export", "export", "Export " + cid + " with the options of New export", () => submitExport(cid)),
      button("Schedule", "choose-schedule", "Schedule exports of " + cid, () => chooseForSchedule(cid)));
    row.append(element("td", cid), element("td", conversation.last_seq),
               timeCell(conversation.last_message_at), actions);
    body.append(row);
  }
  conversationsCursor = page.next_cursor;
  document.getElementById("more-conversations").hidden = !conversationsCursor;
}

let searchTimer = null;
function searchChanged() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => {
    conversationSearch = document.getElementById("conversation-search").value.trim();
    loadConversations(false).catch((error) => say(error.message));
  }, 250);
}

function chooseForSchedule(cid) {
  const field = document.getElementById("schedule-conversation");
  field.value = cid;
  field.focus();
}

// ---- Exports --------------------------------------------------------------------------------------------

async function loadOperations() {
  const page = await (await call("/v3/operations?limit=50")).json();
  document.querySelector("#operations tbody").replaceChildren();
  for (const operation of page.operations.reverse()) show(operation);
}

// The newest SUCCEEDED export of ``cid`` the page knows, for an incremental export after it.
async function lastExportOf(cid) {
  let cursor = null;
  do {
    const query = new URLSearchParams({ state: "SUCCEEDED", limit: "100" });
    if (cursor) query.set("cursor", cursor);
    const page = await (await call("/v3/operations?" + query)).json();
    const found = page.operations.filter((operation) => operation.conversation_id === cid && operation.result)
      .sort((a, b) => b.result.next_after_seq - a.result.next_after_seq)[0];
    if (found) return found;
    cursor = page.next_cursor;
  } while (cursor);
  return null;
}

// The request the export form describes (docs/api.md: Submitting an export, Export options).
// A datetime-local field's value as an instant; a half-filled one is refused rather than left out.
function instantOf(id) {
  const field = document.getElementById(id);
  if (field.validity.badInput) throw new FieldError(id, "Give a full date and time, or leave it empty.");
  return withOffset(field.value);
}

async function exportOptions(cid) {
  const body = { format: document.getElementById("export-format").value };
  const since = instantOf("export-since");
  const until = instantOf("export-until");
  if (since && until && new Date(until) <= new Date(since)) {
    throw new FieldError("export-until", "Until must be later than From.");
  }
  if (since) body.since = since;
  if (until) body.until = until;
  const senders = document.getElementById("export-senders").value.split(",").map((s) => s.trim()).filter(Boolean);
  const bad = senders.find((sender) => !SENDER_ID.test(sender));
  if (bad) {
    throw new FieldError("export-senders", "\u201c" + bad + "\u201d is not a sender id (1 to 64 letters, digits or _ . : -);"
      + " separate several with commas.");
  }
  if (senders.length) body.senders = senders;
  if (document.getElementById("export-gzip").checked) body.compression = "gzip";
  const splitField = document.getElementById("export-split");
  const split = splitField.value.trim();
  if (splitField.validity.badInput || (split && !Number.isFinite(Number(split)))) {
    throw new FieldError("export-split", "Give a number of MiB, or leave it empty for one file.");
  }
  if (split && Number(split) < MIN_SPLIT_MIB) {
    throw new FieldError("export-split", "At least " + MIN_SPLIT_MIB + " MiB, or leave it empty for one file.");
  }
  if (split) body.max_part_bytes = Math.round(Number(split) * MIB);
  const images = document.getElementById("export-media-images").checked;
  if (document.getElementById("export-media").checked) {
    // One ZIP, never compressed again nor split (docs/api.md: Submitting an export, Exports with media).
    if (body.compression) {
      throw new FieldError("export-media", "A ZIP with the files is not gzipped again: clear that option.");
    }
    body.media = true;
    if (images) body.media_types = ["image/*"];
  } else if (images) {
    throw new FieldError("export-media", "Tick \u201cInclude the attached files\u201d to choose which.");
  }
  const notify = document.getElementById("export-notify").value.trim();
  if (notify) body.notify = { url: notify };
  if (document.getElementById("export-incremental").checked) {
    const last = await lastExportOf(cid);
    if (!last) throw new FieldError("export-incremental", "There is no earlier export of " + cid + " to go on from.");
    body.after_seq = last.result.next_after_seq;
  }
  return body;
}

// Start an export of ``cid`` with the form's options; ``fromForm``: the form's own button, not a row's.
async function submitExport(cid, fromForm) {
  const near = fromForm ? "export-status" : "conversations-status";
  const form = document.getElementById("export-form");
  clearProblem(form);
  if (!cid) {
    document.getElementById("export-conversation-error").textContent = "Choose a conversation.";
    document.getElementById("export-conversation").setAttribute("aria-invalid", "true");
    document.getElementById("export-conversation").focus();
    return;
  }
  say("");
  const start = document.getElementById("start-export");
  start.disabled = true;  // one click, one export: a second waits for the first's answer
  try {
    const path = "/v3/conversations/" + encodeURIComponent(cid) + "/exports";
    const response = await postJson(path, await exportOptions(cid), crypto.randomUUID());
    const operation = await response.json();
    show(operation);
    say("Export of " + cid + " started: it is at the top of Your exports.", near);
  } catch (error) {
    showProblem(fromForm ? notAMember(error, cid, "export-conversation") : error, EXPORT_FIELDS, form, near);
  } finally {
    start.disabled = false;
  }
}

function progressCell(operation) {
  const progress = operation.progress;
  const cell = element("td");
  const most = operation.estimate && operation.estimate.messages_at_most;
  const done = operation.state === "SUCCEEDED";
  const bar = element("progress", null, {
    "aria-label": "Progress of " + operation.operation_id, "aria-valuemin": "0",
  });
  if (most || done) {
    const max = done ? Math.max(progress.messages_written, 1) : most;
    const now = done ? max : Math.min(progress.messages_written, max);
    bar.max = max;
    bar.value = now;
    bar.setAttribute("aria-valuemax", String(max));
    bar.setAttribute("aria-valuenow", String(now));
  }
  const bytes = operation.estimate && operation.estimate.bytes;
  const text = (most ? progress.messages_written.toLocaleString("en") + " of at most " + plural(most, "message")
    : plural(progress.messages_written, "message")) + ", " + progress.phase
    + (bytes && !done ? ", about " + humanBytes(bytes) + " in all" : "");
  cell.append(bar, element("span", text, { class: "progress-text" }));
  return cell;
}

// The conversation, and under it what the export was asked for, so that rows of one conversation differ.
function conversationCell(operation) {
  const request = operation.request || {};
  const asked = [String(request.format || "").toUpperCase()];
  if (request.compression && request.compression !== "none") asked.push(request.compression);
  if (request.media) asked.push(request.media_types ? "ZIP with images" : "ZIP with files");
  if (request.max_part_bytes) asked.push("parts of " + humanBytes(request.max_part_bytes));
  if (request.since || request.until) asked.push("a time range");
  if (request.senders) asked.push(plural(request.senders.length, "sender"));
  if (request.after_seq) asked.push("after seq " + request.after_seq);
  if (operation.schedule_id) asked.push("scheduled");
  const cell = element("td", operation.conversation_id);
  cell.append(element("span", asked.filter(Boolean).join(", "), { class: "asked" }));
  return cell;
}

function stateCell(operation) {
  const cell = element("td", operation.state, { class: "state" });
  if (operation.error) cell.setAttribute("title", operation.error.code + ": " + operation.error.message);
  return cell;
}

function show(operation) {
  const id = operation.operation_id;
  const body = document.querySelector("#operations tbody");
  let row = body.querySelector('tr[data-operation-id="' + CSS.escape(id) + '"]');
  const before = row ? row.getAttribute("data-state") : null;
  if (!row) {
    row = element("tr", null, { "data-operation-id": id });
    body.prepend(row);
  }
  row.setAttribute("data-state", operation.state);
  const actions = element("td");
  if (operation.links && operation.links.cancel) {
    actions.append(button("Cancel", "cancel", "Cancel export " + id, () => cancelExport(id)));
  }
  const parts = operation.result && operation.result.parts;
  if (operation.state === "SUCCEEDED" && parts) {
    // One button a part: a browser lets a click save one file.
    for (const part of parts) {
      actions.append(button("Part " + part.number, "download-part", "Download part " + part.number + " of export " + id,
                            () => saveFile(part.url)));
    }
  } else if (operation.state === "SUCCEEDED") {
    actions.append(button("Download", "download", "Download export " + id, () => saveFile(operation.result.url)));
  }
  const result = operation.result;
  const size = !result ? operation.progress.bytes_written
    : result.parts ? result.parts.reduce((sum, part) => sum + part.size_bytes, 0) : result.size_bytes;
  keepingFocus(row, () => row.replaceChildren(
    element("td", id), conversationCell(operation), stateCell(operation), progressCell(operation),
    sizeCell(size, parts ? parts.length : 0), timeCell(operation.created_at), actions),
    document.getElementById("exports-title"));
  const next = row.nextElementSibling;
  const shown = next && next.classList.contains("why-row") ? next : null;
  if (operation.error && ["FAILED", "FAILED_REPAIR"].includes(operation.state)) {
    const line = shown || element("tr", null, { class: "why-row" });
    line.replaceChildren(element("td", "Why: " + operation.error.message, { class: "why", colspan: "7" }));
    row.after(line);
  } else if (shown) {
    shown.remove();
  }
  document.getElementById("no-exports").hidden = body.children.length > 0;
  if (before && before !== operation.state) say("Export " + id + " of " + operation.conversation_id + ": " + operation.state + ".");
  if (!operation.done && !watched.has(id)) {
    watched.set(id, true);
    watch(id).finally(() => watched.delete(id));
  }
}

async function watch(id) {
  let retryAfter = 0;
  if (streams < MAX_STREAMS) {
    streams += 1;
    try {
      if (await streamed(id)) return;
    } catch (error) {
      // The stream is a hint: when it cannot be had, or ends early, the status monitor is polled instead.
      if (error instanceof Problem) retryAfter = error.retryAfter;
    } finally {
      streams -= 1;
    }
  }
  // A stream's 429 holds for polls too (they count against the same policy), and the stream's place is free.
  if (retryAfter) await sleep(jittered(retryAfter));
  await poll(id);
}

// Read the operation's event stream, showing each state; true once it showed the operation done.
async function streamed(id) {
  const response = await call("/v3/operations/" + encodeURIComponent(id) + "/events");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let done = false;
  for (;;) {
    const { value, done: ended } = await reader.read();
    if (ended) return done;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n").filter((line) => line.startsWith("data:"));
      buffer = buffer.slice(end + 2);
      if (!data.length) continue;
      const operation = JSON.parse(data.map((line) => line.slice(5).trim()).join("\n"));
      show(operation);
      done = operation.done;
    }
  }
}

// Poll the status monitor as it asks, sending the version shown, so that an unchanged operation answers 304
// with no body (docs/api.md: Operations, Conditional polls); a failed poll is tried again, later each time, and
// never before a 429's Retry-After or the renewal of a policy the RateLimit field shows spent (docs/api.md: Rate
// limits).
async function poll(id) {
  let operation = null;
  let etag = null;
  let failures = 0;
  for (;;) {
    let seconds;
    try {
      const headers = etag ? { "If-None-Match": etag } : {};
      const response = await call("/v3/operations/" + encodeURIComponent(id), { headers });
      if (response.status !== 304) {
        operation = await response.json();
        etag = response.headers.get("ETag");
        show(operation);
      }
      if (operation && operation.done) return;
      failures = 0;
      seconds = Number(response.headers.get("Retry-After")) || (operation && operation.next_poll_after_seconds) || 1;
      seconds = Math.max(seconds, jittered(renewalSeconds(response)));
    } catch (error) {
      failures += 1;
      seconds = Math.min(60, 2 ** failures) * (0.5 + Math.random() / 2);
      if (error instanceof Problem) seconds = Math.max(seconds, jittered(error.retryAfter));
    }
    await sleep(seconds);
  }
}

async function cancelExport(id) {
  const response = await postJson("/v3/operations/" + encodeURIComponent(id) + "/cancel", {});
  show(await response.json());
}

// Save a result file under the name the API gives it.
async function saveFile(url) {
  const response = await call(url);
  const named = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
  const blob = await response.blob();
  const link = element("a", null, { download: named ? named[1] : "export" });
  link.href = URL.createObjectURL(blob);
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  say("Saved " + link.download + " (" + humanBytes(blob.size) + ").");
}

// ---- Schedules ------------------------------------------------------------------------------------------

// The caller's schedules (docs/schedule-exports.md: On the web page), every page of them, newest first.
async function loadSchedules() {
  const rows = [];
  let cursor = null;
  do {
    const query = "?limit=100" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const page = await (await call("/v3/export-schedules" + query)).json();
    for (const schedule of page.schedules) {
      const row = element("tr", null, { "data-schedule-id": schedule.schedule_id });
      showSchedule(schedule, row);
      rows.push(row);
    }
    cursor = page.next_cursor;
  } while (cursor);
  // A row waiting for a delete's confirmation keeps its place and its focus.
  const body = document.querySelector("#schedules tbody");
  const confirming = body.querySelector("tr.confirming");
  if (confirming) {
    const index = rows.findIndex((row) => row.dataset.scheduleId === confirming.dataset.scheduleId);
    if (index >= 0) rows[index] = confirming;
  }
  // The focus stays where it was: on the same button of the same schedule's new row.
  const active = document.activeElement;
  const was = active && body.contains(active) ? active.closest("tr") : null;
  const kind = was && active.tagName === "BUTTON" ? active.className.split(" ")[0] : null;
  body.replaceChildren(...rows);
  document.getElementById("no-schedules").hidden = rows.length > 0;
  if (was && !was.isConnected) {
    const now = body.querySelector('tr[data-schedule-id="' + CSS.escape(was.dataset.scheduleId) + '"]');
    const target = now && kind ? now.querySelector("button." + CSS.escape(kind)) : null;
    (target || document.getElementById("schedules-title")).focus();
  } else if (was && active.isConnected) {
    active.focus();
  }
}

function scheduleState(schedule) {
  let text = schedule.paused_reason ? PAUSED_WHY[schedule.paused_reason] || "paused: " + schedule.paused_reason
    : schedule.state.toLowerCase();
  if (schedule.waiting_reason) text += ", waiting: " + schedule.waiting_reason;
  return text;
}

function showSchedule(schedule, row) {
  const id = schedule.schedule_id;
  const actions = element("td");
  const action = schedule.state === "ACTIVE" ? "pause" : "resume";
  actions.append(
    button(action === "pause" ? "Pause" : "Resume", action, (action === "pause" ? "Pause " : "Resume ") + id,
           () => changeSchedule(id, action, row)),
    button("Runs", "runs", "Show the runs of " + id, () => showRuns(id)),
    button("Delete", "delete", "Delete " + id, () => askToDelete(id, row, schedule)));
  const last = schedule.last_run;
  const lastCell = last ? element("td", last.state + ", due " + humanTime(last.due_at), { title: last.due_at })
    : element("td", "none yet");
  row.classList.remove("confirming");
  keepingFocus(row, () => row.replaceChildren(
    element("td", id), element("td", schedule.conversation_id),
    element("td", EVERY_WORDS[schedule.every] || schedule.every, { title: schedule.every, class: "every" }),
    element("td", scheduleState(schedule), { class: "state" }), timeCell(schedule.next_run_at, "next-run"),
    lastCell, actions), document.getElementById("schedules-title"));
}

async function changeSchedule(id, action, row) {
  const response = await postJson("/v3/export-schedules/" + encodeURIComponent(id) + "/" + action, {});
  showSchedule(await response.json(), row);
  say("Schedule " + id + (action === "pause" ? " paused." : " resumed."));
}

// A delete asks first, in the row itself: the schedule goes only on the confirmation.
function askToDelete(id, row, schedule) {
  const cell = row.lastElementChild;
  const keep = button("Keep", "keep", "Keep: " + id, () => {
    showSchedule(schedule, row);
    row.querySelector("button.delete").focus();
  });
  const confirm = button("Delete for good", "confirm-delete", "Delete for good: " + id, () => deleteSchedule(id, row));
  cell.replaceChildren(element("span", "Delete this schedule? Its exports stay. ", { class: "question" }), confirm, keep);
  row.classList.add("confirming");
  confirm.focus();
}

// Its runs and their files stay: they are in the exports above until their retention ends.
async function deleteSchedule(id, row) {
  await call("/v3/export-schedules/" + encodeURIComponent(id), { method: "DELETE" });
  const next = row.nextElementSibling && row.nextElementSibling.querySelector("button");
  row.remove();
  (next || document.getElementById("schedules-title")).focus();
  say("Schedule " + id + " deleted.");
}

async function showRuns(id) {
  const page = await (await call("/v3/export-schedules/" + encodeURIComponent(id) + "/runs?limit=20")).json();
  for (const operation of page.operations.slice().reverse()) show(operation);
  say(page.operations.length ? "The runs of " + id + " are in Your exports." : "Schedule " + id + " has no runs yet.");
  document.getElementById("exports-title").focus();
}

async function createSchedule(event) {
  event.preventDefault();
  const form = document.getElementById("schedule-form");
  clearProblem(form);
  const cid = document.getElementById("schedule-conversation").value.trim();
  if (!cid) {
    document.getElementById("schedule-conversation-error").textContent = "Choose a conversation.";
    document.getElementById("schedule-conversation").setAttribute("aria-invalid", "true");
    document.getElementById("schedule-conversation").focus();
    return;
  }
  const body = {
    every: document.getElementById("schedule-every").value,
    format: document.getElementById("schedule-format").value,
    mode: document.getElementById("schedule-full").checked ? "full" : "incremental",
  };
  const start = document.getElementById("schedule-start").value;
  if (start) body.start_at = new Date(withOffset(start)).toISOString();
  try {
    const path = "/v3/conversations/" + encodeURIComponent(cid) + "/export-schedules";
    const schedule = await (await postJson(path, body, crypto.randomUUID())).json();
    await loadSchedules();
    say("Schedule " + schedule.schedule_id + " created: every " + (EVERY_WORDS[schedule.every] || schedule.every) + ".", "schedule-status");
  } catch (error) {
    showProblem(notAMember(error, cid, "schedule-conversation"), SCHEDULE_FIELDS, form, "schedule-status");
  }
}

// ---- Sign-in --------------------------------------------------------------------------------------------

async function useToken() {
  token = document.getElementById("token").value.trim();
  document.getElementById("token").value = "";
  if (waitingForToken.length) {
    const waiting = waitingForToken;
    waitingForToken = [];
    document.getElementById("sign-in").hidden = true;
    say("");
    for (const resume of waiting) resume();
    return;
  }
  try {
    await loadOperations();
    await loadConversations(false);
    await loadSchedules();
    document.getElementById("signed-in").hidden = false;
    document.getElementById("sign-in").hidden = true;
    document.getElementById("exports-title").focus();
    say("Signed in.");
    if (!refreshing) {
      refreshing = setInterval(() => {
        if (!waitingForToken.length) loadSchedules().catch((error) => say(error.message));
      }, SCHEDULES_REFRESH_MS);
    }
  } catch (error) {
    say(error.message);
  }
}

// Both forms begin with the conversation they act on: the same field, with its label and error line, built
// here once for each.
for (const prefix of ["export", "schedule"]) {
  const id = prefix + "-conversation";
  const field = element("div", null, { class: "field" });
  field.append(
    element("label", "Conversation", { for: id }),
    element("input", null, {
      id, name: "conversation", autocomplete: "off", spellcheck: "false", required: "",
      "aria-describedby": id + "-error",
    }),
    element("p", null, { id: id + "-error", class: "field-error" }));
  document.getElementById(prefix + "-form").prepend(field);
}

// A field's error goes once the field is changed.
for (const form of document.querySelectorAll("form")) {
  form.addEventListener("input", (event) => {
    const error = document.getElementById(event.target.id + "-error");
    if (error) error.textContent = "";
    event.target.removeAttribute("aria-invalid");
  });
}
showTimeZone();
document.getElementById("use-token").addEventListener("click", useToken);
document.getElementById("export-form").addEventListener("submit", (event) => {
  event.preventDefault();
  submitExport(document.getElementById("export-conversation").value.trim(), true);
});
document.getElementById("schedule-form").addEventListener("submit", createSchedule);
document.getElementById("conversation-search").addEventListener("input", searchChanged);
document.getElementById("more-conversations").addEventListener("click",
  () => loadConversations(true).catch((error) => say(error.message)));
