// The official MCP TypeScript SDK, as an MCP host would use it, against a
// real sbx server: over streamable HTTP at /mcp, and over stdio through
// `sbx mcp`. Run by internal/server/mcp_integration_test.go with
//   SBX_URL      the server's base URL
//   SBX_API_KEY  its API key (may be empty)
//   SBX_BIN      the sbx binary (for stdio)
//   SBX_RUN      a name unique to the run, so users do not meet
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

const url = process.env.SBX_URL;
const key = process.env.SBX_API_KEY || '';
const bin = process.env.SBX_BIN;
const run = process.env.SBX_RUN || 'local';
assert.ok(url && bin, 'SBX_URL and SBX_BIN must be set');

const wantTools = ['execute_code', 'list_files', 'read_file', 'run_bash', 'upload_file'];

function text(result) {
  return result.content.filter((c) => c.type === 'text').map((c) => c.text).join('');
}

async function connectHTTP(user) {
  const endpoint = new URL('/mcp', url);
  endpoint.searchParams.set('user_id', user);
  endpoint.searchParams.set('agent_id', 'mcp');
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(endpoint, { requestInit: { headers } }));
  return client;
}

async function connectStdio(user) {
  const env = { ...process.env, SBX_SERVER: url, SBX_API_KEY: key };
  const client = new Client({ name: 'sbx-mcp-test', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: bin, args: ['mcp', '--user', user, '--agent', 'mcp', '--conversation', 'c1'], env, stderr: 'inherit',
  }));
  return client;
}

// What an agent does with the tools: list them, run code that builds on
// the last run, read a large file a part at a time, see its mistakes.
async function agentWork(client, label) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), wantTools);
  for (const t of tools) {
    assert.equal(t.inputSchema.type, 'object', `${t.name} schema`);
    assert.ok(t.description.length > 20, `${t.name} description`);
  }
  const readFile = tools.find((t) => t.name === 'read_file');
  assert.ok(readFile.inputSchema.properties.offset && readFile.inputSchema.properties.length);
  assert.equal(readFile.annotations?.readOnlyHint, true);

  // execute_code writes a file and returns a value; the next call sees it.
  let r = await client.callTool({
    name: 'execute_code',
    arguments: {
      code: [
        'lines = [f"{i:05d} {label}" for i in range(4000)]',
        "open('/workspace/report.txt', 'w').write('\\n'.join(lines) + '\\n')",
        "print('wrote', len(lines))",
        'return len(lines)',
      ].join('\n').replace('{label}', label),
    },
  });
  assert.ok(!r.isError, text(r));
  assert.match(text(r), /stdout:\nwrote 4000/);
  assert.match(text(r), /result: 4000/);
  assert.equal(r.structuredContent.status, 'completed');

  r = await client.callTool({ name: 'execute_code', arguments: { code: "return sum(1 for _ in open('/workspace/report.txt'))" } });
  assert.ok(!r.isError, text(r));
  assert.match(text(r), /result: 4000/);

  // read_file in two parts.
  const want = Array.from({ length: 4000 }, (_, i) => `${String(i).padStart(5, '0')} ${label}`).join('\n') + '\n';
  const half = Math.floor(want.length / 2);
  const first = await client.callTool({ name: 'read_file', arguments: { path: 'report.txt', offset: 0, length: half } });
  assert.ok(!first.isError, text(first));
  assert.equal(first.structuredContent.eof, false);
  assert.equal(first.structuredContent.next_offset, half);
  const second = await client.callTool({
    name: 'read_file', arguments: { path: 'report.txt', offset: first.structuredContent.next_offset, length: 1048576 },
  });
  assert.ok(!second.isError, text(second));
  assert.equal(second.structuredContent.eof, true);
  assert.equal(first.structuredContent.content + second.structuredContent.content, want);
  assert.match(text(first), /more: read again with offset/);

  // Mistakes come back for the model to see.
  r = await client.callTool({ name: 'execute_code', arguments: { code: '1/0' } });
  assert.equal(r.isError, true);
  assert.match(text(r), /ZeroDivisionError/);
  r = await client.callTool({ name: 'run_bash', arguments: { command: 'echo to-stderr >&2; exit 3' } });
  assert.equal(r.isError, true);
  assert.match(text(r), /stderr:\nto-stderr/);
  assert.match(text(r), /exit code: 3/);
  r = await client.callTool({ name: 'read_file', arguments: { path: 'no-such-file' } });
  assert.equal(r.isError, true);
  r = await client.callTool({ name: 'read_file', arguments: { path: 'report.txt', invented: 1 } });
  assert.equal(r.isError, true);
  assert.match(text(r), /invented/);

  r = await client.callTool({ name: 'upload_file', arguments: { path: 'notes/todo.md', content: '# todo\n' } });
  assert.ok(!r.isError, text(r));
  r = await client.callTool({ name: 'list_files', arguments: { recursive: true } });
  assert.match(text(r), /notes\/todo\.md \(7 bytes\)/);
  assert.match(text(r), /report\.txt/);
}

test('streamable HTTP at /mcp', async () => {
  const client = await connectHTTP(`http-${run}`);
  try {
    assert.equal(client.getServerVersion().name, 'sbx');
    await agentWork(client, 'http');
  } finally {
    await client.close();
  }
});

test('stdio through sbx mcp', async () => {
  const client = await connectStdio(`stdio-${run}`);
  try {
    assert.equal(client.getServerVersion().name, 'sbx');
    await agentWork(client, 'stdio');
  } finally {
    await client.close();
  }
});

test('two users do not share files', async () => {
  const a = await connectHTTP(`iso-a-${run}`);
  const b = await connectHTTP(`iso-b-${run}`);
  try {
    let r = await a.callTool({ name: 'upload_file', arguments: { path: 'secret.txt', content: 'only a' } });
    assert.ok(!r.isError, text(r));
    r = await b.callTool({ name: 'read_file', arguments: { path: 'secret.txt' } });
    assert.equal(r.isError, true);
    r = await b.callTool({ name: 'run_bash', arguments: { command: 'cat /workspace/secret.txt' } });
    assert.equal(r.isError, true);
  } finally {
    await a.close();
    await b.close();
  }
});
