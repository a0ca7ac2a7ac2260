// The page of chatexport (docs/api.md: Web page). It talks to the API with fetch only: the token
// pasted in lives in this script's memory and travels in the Authorization header, never in a URL; the
// event stream is read with fetch; a result is fetched and saved as a blob. Everything shown is set as
// text (textContent), never parsed as HTML.
"use strict";

let token = null;
const watched = new Map();
// Requests that were refused with a 401 after sign-in wait here for the next token the user pastes.
let waitingForToken = [];

function element(tag, text, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, value);
  return node;
}

function say(text) {
  document.getElementById("message").textContent = text;
}

function signedIn() {
  return !document.getElementById("signed-in").hidden;
}

// A token refused after sign-in (it expired, or the identity provider rotated its key): ask for a new one and
// keep everything as it is; the refused request is sent again with it.
function askForToken() {
  say("Your token was refused (it may have expired). Paste a new one and choose Use token to go on.");
  document.getElementById("token").focus();
  return new Promise((resolve) => waitingForToken.push(resolve));
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
    throw new Error(problem.code + ": " + (problem.detail || ""));
  }
  return response;
}

async function loadConversations() {
  const body = document.querySelector("#conversations tbody");
  body.replaceChildren();
  let cursor = null;
  do {
    const query = cursor ? "?cursor=" + encodeURIComponent(cursor) : "";
    const page = await (await call("/v2/conversations" + query)).json();
    for (const conversation of page.conversations) {
      const row = element("tr", null, { "data-cid": conversation.conversation_id });
      row.append(element("td", conversation.conversation_id), element("td", conversation.last_seq),
                 element("td", conversation.last_message_at || "no messages"));
      const button = element("button", "Export", { type: "button", class: "export" });
      button.addEventListener("click", () => submitExport(conversation.conversation_id).catch((e) => say(e.message)));
      const actions = element("td");
      actions.append(button);
      row.append(actions);
      body.append(row);
    }
    cursor = page.next_cursor;
  } while (cursor);
}

async function loadOperations() {
  const page = await (await call("/v3/operations?limit=50")).json();
  document.querySelector("#operations tbody").replaceChildren();
  for (const operation of page.operations.reverse()) show(operation);
}

async function submitExport(conversationId) {
  const response = await call("/v3/conversations/" + encodeURIComponent(conversationId) + "/exports", {
    method: "POST",
    headers: { "Content-Type": "application/json", "Idempotency-Key": crypto.randomUUID() },
    body: JSON.stringify({ format: "jsonl" }),
  });
  show(await response.json());
  say("");
}

function show(operation) {
  const id = operation.operation_id;
  const body = document.querySelector("#operations tbody");
  let row = body.querySelector('tr[data-operation-id="' + CSS.escape(id) + '"]');
  if (!row) {
    row = element("tr", null, { "data-operation-id": id });
    body.prepend(row);
  }
  const progress = operation.progress;
  const actions = element("td");
  if (operation.links && operation.links.cancel) {
    const cancel = element("button", "Cancel", { type: "button", class: "cancel" });
    cancel.addEventListener("click", () => cancelExport(id).catch((e) => say(e.message)));
    actions.append(cancel);
  }
  if (operation.state === "SUCCEEDED") {
    const download = element("button", "Download", { type: "button", class: "download" });
    download.addEventListener("click", () => downloadResult(operation).catch((e) => say(e.message)));
    actions.append(download);
  }
  row.replaceChildren(
    element("td", id), element("td", operation.conversation_id), element("td", operation.state, { class: "state" }),
    element("td", progress.phase + ": " + progress.messages_written + " messages, " + progress.bytes_written + " bytes"),
    actions);
  if (!operation.done && !watched.has(id)) {
    watched.set(id, true);
    watch(id).finally(() => watched.delete(id));
  }
}

async function watch(id) {
  try {
    const response = await call("/v3/operations/" + encodeURIComponent(id) + "/events");
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const data = buffer.slice(0, end).split("\n").filter((line) => line.startsWith("data:"));
        buffer = buffer.slice(end + 2);
        if (data.length) show(JSON.parse(data.map((line) => line.slice(5).trim()).join("\n")));
      }
    }
  } catch (error) {
    // The stream is a hint: when it cannot be had, poll the status monitor as it asks, sending the version
    // shown, so that an unchanged operation answers 304 with no body
    // (docs/api.md: Operations, Conditional polls).
    let operation = null;
    let etag = null;
    for (;;) {
      const headers = etag ? { "If-None-Match": etag } : {};
      const response = await call("/v3/operations/" + encodeURIComponent(id), { headers });
      if (response.status !== 304) {
        operation = await response.json();
        etag = response.headers.get("ETag");
        show(operation);
      }
      if (operation.done) return;
      const seconds = Number(response.headers.get("Retry-After")) || operation.next_poll_after_seconds || 1;
      await new Promise((resolve) => setTimeout(resolve, 1000 * seconds));
    }
  }
}

async function cancelExport(id) {
  const response = await call("/v3/operations/" + encodeURIComponent(id) + "/cancel", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
  });
  show(await response.json());
}

// A split result is saved part by part, each under the name the API gives it.
async function downloadResult(operation) {
  const parts = operation.result.parts;
  for (const url of parts ? parts.map((part) => part.url) : [operation.result.url]) await saveFile(url);
}

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
}

// The caller's schedules (docs/schedule-exports.md: On the web page), every page of them, newest first.
async function loadSchedules() {
  const body = document.querySelector("#schedules tbody");
  body.replaceChildren();
  let cursor = null;
  do {
    const query = "?limit=100" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
    const page = await (await call("/v3/export-schedules" + query)).json();
    for (const schedule of page.schedules) {
      const row = element("tr", null, { "data-schedule-id": schedule.schedule_id });
      body.append(row);
      showSchedule(schedule, row);
    }
    cursor = page.next_cursor;
  } while (cursor);
}

function scheduleState(schedule) {
  let text = schedule.state;
  if (schedule.paused_reason) text += " (" + schedule.paused_reason + ")";
  if (schedule.waiting_reason) text += ", waiting: " + schedule.waiting_reason;
  return text;
}

function showSchedule(schedule, row) {
  const id = schedule.schedule_id;
  const actions = element("td");
  const action = schedule.state === "ACTIVE" ? "pause" : "resume";
  const change = element("button", action === "pause" ? "Pause" : "Resume", { type: "button", class: action });
  change.addEventListener("click", () => changeSchedule(id, action, row).catch((e) => say(e.message)));
  const remove = element("button", "Delete", { type: "button", class: "delete" });
  remove.addEventListener("click", () => deleteSchedule(id, row).catch((e) => say(e.message)));
  actions.append(change, remove);
  const last = schedule.last_run;
  row.replaceChildren(
    element("td", id), element("td", schedule.conversation_id), element("td", schedule.every),
    element("td", scheduleState(schedule), { class: "state" }),
    element("td", schedule.next_run_at || "none", { class: "next-run" }),
    element("td", last ? last.state + ", due " + last.due_at : "none yet"), actions);
}

async function changeSchedule(id, action, row) {
  const response = await call("/v3/export-schedules/" + encodeURIComponent(id) + "/" + action, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
  });
  showSchedule(await response.json(), row);
  say("");
}

// Its runs and their files stay: they are in the exports above until their retention ends.
async function deleteSchedule(id, row) {
  await call("/v3/export-schedules/" + encodeURIComponent(id), { method: "DELETE" });
  row.remove();
  say("");
}

document.getElementById("use-token").addEventListener("click", async () => {
  token = document.getElementById("token").value.trim();
  document.getElementById("token").value = "";
  if (waitingForToken.length) {
    const waiting = waitingForToken;
    waitingForToken = [];
    say("");
    for (const resume of waiting) resume();
    return;
  }
  try {
    await loadConversations();
    await loadOperations();
    await loadSchedules();
    document.getElementById("signed-in").hidden = false;
    say("");
  } catch (error) {
    say(error.message);
  }
});
