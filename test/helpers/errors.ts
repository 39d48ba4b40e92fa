import {expect} from 'vitest'

/** The error `p` rejects with, asserted to be a `cls` (a resolved promise fails the test). */
export async function rejection<E extends Error>(p: Promise<unknown>, cls: new (...args: never[]) => E): Promise<E> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(cls)
  return err as E
}
