// Commands, lifecycle and the control plane through the unmodified e2b SDK,
// configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, SandboxNotFoundError } from 'e2b'

let sbx

before(async () => {
  sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { suite: 'sbx-compat' } })
})

after(async () => {
  await sbx?.kill().catch(() => {})
})

test('create gives a running sandbox of the base template', async () => {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.suite, 'sbx-compat')
  assert.ok(info.endAt > info.startedAt)
  assert.equal(await sbx.isRunning(), true)
})

test('commands.run returns stdout and exit code 0', async () => {
  const r = await sbx.commands.run('echo hello; echo world')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\nworld\n')
  assert.equal(r.stderr, '')
})

test('commands.run returns stderr', async () => {
  const r = await sbx.commands.run('echo oops >&2')
  assert.equal(r.stderr, 'oops\n')
  assert.equal(r.stdout, '')
})

test('a non-zero exit raises CommandExitError', async () => {
  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'partial\n')
    assert.equal(err.stderr, 'bad\n')
    return true
  })
})

test('env vars reach the command', async () => {
  const r = await sbx.commands.run('echo "$GREETING $WHO"', { envs: { GREETING: 'hi', WHO: 'there' } })
  assert.equal(r.stdout, 'hi there\n')
})

test('sandbox env vars from create reach commands', async () => {
  const s2 = await Sandbox.create({ envs: { FROM_CREATE: 'yes' } })
  try {
    const r = await s2.commands.run('echo $FROM_CREATE')
    assert.equal(r.stdout, 'yes\n')
  } finally {
    await s2.kill()
  }
})

test('cwd is honoured', async () => {
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  await sbx.commands.run('mkdir -p sub/dir')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/home/user/sub/dir' })).stdout, '/home/user/sub/dir\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: 'sub' })).stdout, '/home/user/sub\n')
  // As on E2B: commands start in the home directory, which is HOME.
  assert.equal((await sbx.commands.run('pwd; echo $HOME; ls -d sub')).stdout, '/home/user\n/home/user\nsub\n')
  await assert.rejects(sbx.commands.run('true', { cwd: '/no/such/dir' }), CommandExitError)
})

test('output streams to callbacks as it comes', async () => {
  const seen = []
  const r = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.2; done; echo e >&2', {
    onStdout: (d) => seen.push(['out', d]),
    onStderr: (d) => seen.push(['err', d]),
  })
  assert.equal(r.stdout, 'line1\nline2\nline3\n')
  assert.equal(seen.filter(([k]) => k === 'out').map(([, d]) => d).join(''), 'line1\nline2\nline3\n')
  assert.ok(seen.some(([k, d]) => k === 'err' && d === 'e\n'))
  assert.ok(seen.filter(([k]) => k === 'out').length >= 2, 'stdout came in one piece: not streamed')
})

test('a background command can be listed and killed', async () => {
  // Kill only once it has printed: what it printed before stays.
  let printed
  const started = new Promise((resolve) => { printed = resolve })
  const h = await sbx.commands.run('echo started; sleep 600', {
    background: true,
    onStdout: (d) => d.includes('started') && printed(),
  })
  assert.ok(h.pid > 0)
  const list = await sbx.commands.list()
  assert.ok(list.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(list)}`)
  await started
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), CommandExitError)
  assert.equal(h.stdout, 'started\n')
  const after = await sbx.commands.list()
  assert.ok(!after.some((p) => p.pid === h.pid), 'killed command still listed')
  assert.equal(await sbx.commands.kill(h.pid), false)
})

test('a background command finishes on its own and wait() returns it', async () => {
  const h = await sbx.commands.run('sleep 0.5; echo done', { background: true })
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'done\n')
})

test('setTimeout moves the end of the sandbox', async () => {
  await sbx.setTimeout(600_000)
  const info = await sbx.getInfo()
  const left = info.endAt.getTime() - Date.now()
  assert.ok(left > 500_000 && left <= 601_000, `ends in ${left} ms`)
})

test('Sandbox.list shows the sandbox', async () => {
  const p = Sandbox.list({ query: { metadata: { suite: 'sbx-compat' } } })
  const items = await p.nextItems()
  assert.ok(items.some((s) => s.sandboxId === sbx.sandboxId), JSON.stringify(items))
})

test('getMetrics reports CPU, memory and disk', async () => {
  await sbx.commands.run('head -c 5000000 /dev/urandom > metrics.bin')
  // At least the reading the server takes for the call; then its samples.
  const metrics = await sbx.getMetrics()
  assert.ok(metrics.length >= 1, JSON.stringify(metrics))
  const m = metrics[metrics.length - 1]
  assert.ok(m.timestamp instanceof Date && Math.abs(m.timestamp.getTime() - Date.now()) < 60_000, `${m.timestamp}`)
  assert.ok(m.cpuCount >= 1, `cpuCount ${m.cpuCount}`)
  assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
  assert.ok(m.memUsed > 0 && m.memTotal >= m.memUsed && m.memCache >= 0, JSON.stringify(m))
  assert.ok(m.diskTotal > 0 && m.diskUsed >= 5_000_000 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
  for (let i = 1; i < metrics.length; i++) {
    assert.ok(metrics[i - 1].timestamp <= metrics[i].timestamp, 'oldest first')
  }
  // A window that ended long ago has nothing; the static form works too.
  assert.deepEqual(await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(1000), end: new Date(2000) }), [])
  await sbx.commands.run('rm metrics.bin')
})

test('pause and connect keep the files', async () => {
  await sbx.files.write('kept.txt', 'still here')
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await sbx.pause(), false)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.getInfo()).state, 'running')
  assert.equal((await again.commands.run('cat kept.txt')).stdout, 'still here')
})

test('kill ends the sandbox; a second kill returns false', async () => {
  const s2 = await Sandbox.create()
  await s2.commands.run('true')
  assert.equal(await s2.kill(), true)
  assert.equal(await Sandbox.kill(s2.sandboxId), false)
  assert.equal(await s2.isRunning(), false)
  await assert.rejects(s2.getInfo(), SandboxNotFoundError)
  await assert.rejects(s2.commands.run('true'))
})
