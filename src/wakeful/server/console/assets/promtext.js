// Parse the Prometheus text exposition format (what /metrics serves, from wakeful's own
// registry or prometheus-client): samples as {name, labels, value}.

export function parseMetrics(text) {
  const samples = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!match) continue;
    const value = Number(match[4] === "+Inf" ? Infinity : match[4] === "-Inf" ? -Infinity : match[4]);
    samples.push({ name: match[1], labels: parseLabels(match[3] || ""), value });
  }
  return samples;
}

function parseLabels(text) {
  const labels = {};
  const pattern = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  let match;
  while ((match = pattern.exec(text))) {
    labels[match[1]] = match[2].replace(/\\n/g, "\n").replace(/\\"/g, '"').replace(/\\\\/g, "\\");
  }
  return labels;
}

// The sum of the samples named `name` whose labels include `where`.
export function total(samples, name, where = {}) {
  let sum = 0;
  let found = false;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (Object.entries(where).some(([k, v]) => s.labels[k] !== v)) continue;
    sum += s.value;
    found = true;
  }
  return found ? sum : null;
}
