// A Server-Sent Events follower over fetch (EventSource cannot send an Authorization
// header). It reconnects by itself with Last-Event-ID and a growing delay, and reports its
// state ("live", "reconnecting", "stopped") so the page can show it.

import { ApiError, headers, session } from "./api.js";

const MIN_DELAY = 500;
const MAX_DELAY = 10000;

export function follow(path, { lastEventId = null, onFrame, onState = () => {}, onRefused }) {
  let stopped = false;
  let controller = null;
  let delay = MIN_DELAY;
  let last = lastEventId;

  async function connect() {
    while (!stopped) {
      controller = new AbortController();
      const extra = { Accept: "text/event-stream" };
      if (last !== null && last !== undefined) extra["Last-Event-ID"] = String(last);
      let response = null;
      try {
        response = await fetch(path, {
          headers: headers(extra),
          signal: controller.signal,
          credentials: "omit",
          cache: "no-store",
        });
      } catch (error) {
        if (stopped) return;
        onState("reconnecting", "connection lost");
      }
      if (response && !response.ok) {
        let problem = {};
        try {
          problem = await response.json();
        } catch {
          problem = {};
        }
        const error = new ApiError(response.status, problem);
        if (response.status === 401) {
          stopped = true;
          onState("stopped", error.message);
          if (session.token) session.onExpired(error);
          return;
        }
        if (response.status === 410 && Number.isInteger(problem.earliest_seq)) {
          last = problem.earliest_seq - 1; // compacted: continue from what is left
          continue;
        }
        if ([403, 404, 422].includes(response.status)) {
          stopped = true;
          onState("stopped", error.message);
          if (onRefused) onRefused(error);
          return;
        }
        onState("reconnecting", error.message);
      } else if (response) {
        onState("live");
        delay = MIN_DELAY;
        try {
          await read(response.body, (frame) => {
            if (frame.id !== null) last = frame.id;
            onFrame(frame);
          });
          if (!stopped) onState("reconnecting", "the stream ended");
        } catch (error) {
          if (stopped) return;
          onState("reconnecting", "connection lost");
        }
      }
      if (stopped) return;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, MAX_DELAY);
    }
  }

  connect();
  return {
    close() {
      stopped = true;
      if (controller) controller.abort();
    },
    get lastEventId() {
      return last;
    },
  };
}

// Parse an SSE byte stream (the HTML standard, "event stream interpretation").
async function read(body, emit) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let frame = { id: null, event: "message", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
      if (line === "") {
        if (frame.data.length) {
          const text = frame.data.join("\n");
          let data = text;
          try {
            data = JSON.parse(text);
          } catch {
            data = text;
          }
          emit({ id: frame.id, event: frame.event, data });
        }
        frame = { id: null, event: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let text = colon < 0 ? "" : line.slice(colon + 1);
      if (text.startsWith(" ")) text = text.slice(1);
      if (field === "data") frame.data.push(text);
      else if (field === "event") frame.event = text;
      else if (field === "id") frame.id = text;
    }
  }
}
