// Files through the unmodified e2b SDK.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Readable } from 'node:stream'
import { Sandbox, FileNotFoundError } from 'e2b'

let sbx

before(async () => {
  sbx = await Sandbox.create()
})

after(async () => {
  await sbx?.kill().catch(() => {})
})

test('write and read text', async () => {
  const info = await sbx.files.write('/home/user/hello.txt', 'hello, sbx')
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello, sbx')
  assert.equal(await sbx.files.read('hello.txt'), 'hello, sbx')
  // The same file, seen by a command.
  assert.equal((await sbx.commands.run('cat /workspace/hello.txt')).stdout, 'hello, sbx')
  // E2B code names its home literally; it is there.
  assert.equal((await sbx.commands.run('cat /home/user/hello.txt')).stdout, 'hello, sbx')
  assert.equal((await sbx.commands.run('cd /home/user && cat hello.txt && pwd')).stdout, 'hello, sbx/home/user\n')
})

test('a file written by a command can be read', async () => {
  await sbx.commands.run('printf "from bash" > made.txt')
  assert.equal(await sbx.files.read('made.txt'), 'from bash')
})

test('write and read bytes into a new directory', async () => {
  const data = new Uint8Array([0, 1, 2, 255, 254])
  await sbx.files.write('deep/er/bin.dat', data)
  const back = await sbx.files.read('deep/er/bin.dat', { format: 'bytes' })
  assert.deepEqual(Array.from(back), Array.from(data))
})

test('writeFiles writes several files', async () => {
  const infos = await sbx.files.write([
    { path: 'multi/a.txt', data: 'A' },
    { path: 'multi/b.txt', data: 'B' },
  ])
  assert.equal(infos.length, 2)
  assert.equal(await sbx.files.read('multi/b.txt'), 'B')
})

test('list shows files and directories', async () => {
  await sbx.files.write('listme/one.txt', '1')
  await sbx.files.makeDir('listme/sub')
  const entries = await sbx.files.list('listme')
  const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
  assert.equal(byName['one.txt'].type, 'file')
  assert.equal(byName['one.txt'].size, 1)
  assert.equal(byName['one.txt'].path, '/home/user/listme/one.txt')
  assert.equal(byName['sub'].type, 'dir')
  assert.equal(entries.length, 2)
})

test('exists, getInfo, remove', async () => {
  await sbx.files.write('gone.txt', 'x')
  assert.equal(await sbx.files.exists('gone.txt'), true)
  assert.equal((await sbx.files.getInfo('gone.txt')).type, 'file')
  await sbx.files.remove('gone.txt')
  assert.equal(await sbx.files.exists('gone.txt'), false)
  await assert.rejects(sbx.files.read('gone.txt'), FileNotFoundError)
  await assert.rejects(sbx.files.getInfo('gone.txt'), FileNotFoundError)
})

test('makeDir and rename', async () => {
  assert.equal(await sbx.files.makeDir('newdir/inner'), true)
  assert.equal(await sbx.files.makeDir('newdir/inner'), false)
  await sbx.files.write('newdir/f.txt', 'f')
  const moved = await sbx.files.rename('newdir/f.txt', 'newdir/inner/g.txt')
  assert.equal(moved.path, '/home/user/newdir/inner/g.txt')
  assert.equal(await sbx.files.read('newdir/inner/g.txt'), 'f')
  await sbx.files.remove('newdir')
  assert.equal(await sbx.files.exists('newdir'), false)
})

test('paths outside the workspace are refused', async () => {
  await assert.rejects(sbx.files.read('/etc/passwd'))
  await assert.rejects(sbx.files.write('../escape.txt', 'x'))
})

test('what sbx keeps in the workspace is not the file calls\' to change', async () => {
  await assert.rejects(sbx.files.remove('/home/user'))
  await assert.rejects(sbx.files.remove('uploads'))
  await assert.rejects(sbx.files.write('.resources/skill.md', 'x'))
  await assert.rejects(sbx.files.rename('uploads', 'mine'))
  await assert.rejects(sbx.files.makeDir('.resources/new'))
  assert.equal(await sbx.files.exists('uploads'), true)
})

test('a 20 MB file goes up and comes back intact', async () => {
  const big = randomBytes(20 << 20)
  const sum = createHash('sha256').update(big).digest('hex')
  await sbx.files.write('big.bin', big.buffer.slice(big.byteOffset, big.byteOffset + big.length))
  const back = await sbx.files.read('big.bin', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.equal(createHash('sha256').update(back).digest('hex'), sum)
  const r = await sbx.commands.run('sha256sum big.bin')
  assert.equal(r.stdout.split(' ')[0], sum)
})

test('a streamed (octet-stream) upload works', async () => {
  const chunks = [Buffer.from('streamed '), Buffer.from('upload')]
  const web = Readable.toWeb(Readable.from(chunks))
  await sbx.files.write('streamed.txt', web)
  assert.equal(await sbx.files.read('streamed.txt'), 'streamed upload')
})

test('two sandboxes never see each other\'s files', async () => {
  const a = await Sandbox.create()
  const b = await Sandbox.create()
  try {
    await a.files.write('secret.txt', 'only a')
    assert.equal(await a.files.exists('secret.txt'), true)
    assert.equal(await b.files.exists('secret.txt'), false)
    assert.ok(!(await b.files.list('/home/user')).some((e) => e.name === 'secret.txt'))
    const r = await b.commands.run('ls -a /workspace; cat /workspace/secret.txt 2>&1 || true')
    assert.ok(!r.stdout.includes('only a'), r.stdout)
    assert.equal((await a.commands.run('cat secret.txt')).stdout, 'only a')
  } finally {
    await a.kill()
    await b.kill()
  }
})
