// A structural diff of two JSON values: the paths that were added, removed or changed.

export function diff(before, after, path = "$", out = []) {
  if (same(before, after)) return out;
  const objects = isObject(before) && isObject(after);
  const arrays = Array.isArray(before) && Array.isArray(after);
  if (objects) {
    const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
    for (const key of keys) {
      const child = `${path}.${key}`;
      if (!(key in after)) out.push({ path: child, kind: "removed", before: before[key] });
      else if (!(key in before)) out.push({ path: child, kind: "added", after: after[key] });
      else diff(before[key], after[key], child, out);
    }
  } else if (arrays) {
    const common = Math.min(before.length, after.length);
    for (let i = 0; i < common; i++) diff(before[i], after[i], `${path}[${i}]`, out);
    for (let i = common; i < after.length; i++) out.push({ path: `${path}[${i}]`, kind: "added", after: after[i] });
    for (let i = common; i < before.length; i++) out.push({ path: `${path}[${i}]`, kind: "removed", before: before[i] });
  } else {
    out.push({ path, kind: "changed", before, after });
  }
  return out;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}
